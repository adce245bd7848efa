"""The OTLP profiles request carries each sample's route as the attribute
``http.route`` (issue 26), decoded with opentelemetry-proto."""

from __future__ import annotations

from heapwatch.formats.otlp_profiles import encode_profiles_request
from heapwatch.formats.pprof import HeapSample
from support.profiles_proto import profiles_service_pb2

pb = profiles_service_pb2()

FRAMES = [("/srv/shared.py", 9, "serialize"), ("/srv/app.py", 3, "<module>")]


def test_samples_with_a_route_carry_http_route() -> None:
    samples = [
        HeapSample(FRAMES, 3, 6000, alloc_size=9000, route="/items/{id}"),
        HeapSample(FRAMES, 1, 2000, alloc_size=2000, route="/users/{uid}"),
        HeapSample(FRAMES, 1, 1000, alloc_size=1000),
        HeapSample(FRAMES, 1, 500, alloc_size=500, route="/items/{id}"),
    ]
    data = encode_profiles_request(
        samples, resource={}, scope_version="0", mode="exact", sample_interval=0, time_nanos=1
    )
    request = pb.ExportProfilesServiceRequest.FromString(data)
    dictionary = request.dictionary
    strings = dictionary.string_table

    def routes(profile: object) -> list[tuple[str, int]]:
        out = []
        for sample in profile.samples:  # type: ignore[attr-defined]
            names = [
                dictionary.attribute_table[i].value.string_value
                for i in sample.attribute_indices
                if strings[dictionary.attribute_table[i].key_strindex] == "http.route"
            ]
            out.append((names[0] if names else "", sample.values[0]))
        return out

    inuse, alloc = request.resource_profiles[0].scope_profiles[0].profiles
    assert routes(inuse) == [
        ("/items/{id}", 6000),
        ("/users/{uid}", 2000),
        ("", 1000),
        ("/items/{id}", 500),
    ]
    assert routes(alloc)[0] == ("/items/{id}", 9000)
    # One attribute per route, beside the frames' type.
    keys = [strings[a.key_strindex] for a in dictionary.attribute_table]
    assert keys.count("http.route") == 2
