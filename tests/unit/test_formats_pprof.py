"""The pprof exporter: encode, decode with our own decoder, check every field."""

from __future__ import annotations

import gzip
from typing import Any

import pytest

from heapwatch.formats import pprof
from heapwatch.formats.pprof import (
    INT64_MAX,
    UNKNOWN,
    HeapSample,
    decode_profile,
    encode_heap_profile,
    heap_samples_from_tracebacks,
)
from heapwatch.formats.protobuf import (
    UINT64_MAX,
    ProtoWriter,
    encode_varint,
    iter_fields,
    to_int64,
    unpack_varints,
)

T0 = 1_700_000_000_123_456_789

LEAK = ("leaky.py", 42, "grow")
HANDLE = ("app.py", 10, "handle")
MODULE = ("app.py", 3, "<module>")


def encode(samples: list[HeapSample], **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("mode", "sample")
    kwargs.setdefault("sample_interval", 512 * 1024)
    kwargs.setdefault("time_nanos", T0)
    return decode_profile(encode_heap_profile(samples, **kwargs))


def string(profile: dict[str, Any], index: int) -> str:
    table: list[str] = profile["string_table"]
    assert 0 <= index < len(table)
    return table[index]


def stacks(profile: dict[str, Any]) -> list[tuple[list[tuple[str, str, int]], list[int]]]:
    """Each sample as ([(function, filename, line), ...] leaf first, values)."""
    functions = {f["id"]: f for f in profile["function"]}
    locations = {loc["id"]: loc for loc in profile["location"]}
    result = []
    for sample in profile["sample"]:
        frames = []
        for location_id in sample["location_id"]:
            (line,) = locations[location_id]["line"]
            function = functions[line["function_id"]]
            frames.append(
                (
                    string(profile, function["name"]),
                    string(profile, function["filename"]),
                    line["line"],
                )
            )
        result.append((frames, sample["value"]))
    return result


def labels(profile: dict[str, Any], sample: dict[str, Any]) -> dict[str, int]:
    return {string(profile, label["key"]): label["num"] for label in sample["label"]}


# --- the protobuf writer and reader -------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (16_384, b"\x80\x80\x01"),
        (INT64_MAX, b"\xff" * 8 + b"\x7f"),
        (UINT64_MAX, b"\xff" * 9 + b"\x01"),
        (-1, b"\xff" * 9 + b"\x01"),
        (-(1 << 63), b"\x80" * 9 + b"\x01"),
    ],
)
def test_varint_encoding(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert unpack_varints(encoded) == [value & UINT64_MAX]
    assert to_int64(unpack_varints(encoded)[0]) == (value if value <= INT64_MAX else value - 2**64)


@pytest.mark.parametrize("value", [UINT64_MAX + 1, -(1 << 63) - 1])
def test_varint_out_of_range(value: int) -> None:
    with pytest.raises(ValueError, match="does not fit"):
        encode_varint(value)


def test_writer_fields_round_trip() -> None:
    inner = ProtoWriter()
    inner.int_field(1, 7)
    writer = ProtoWriter()
    writer.int_field(1, 0)  # proto3 default: omitted
    writer.bool_field(2, False)  # likewise
    writer.int_field(3, -2)
    writer.bool_field(4, True)
    writer.bytes_field(5, b"")  # an empty repeated element still counts
    writer.message_field(6, inner)
    writer.packed_field(7, [1, 300, 0])
    writer.packed_field(8, [])  # nothing to write
    fields = list(iter_fields(writer.getvalue()))
    assert fields == [
        (3, 0, UINT64_MAX - 1),
        (4, 0, 1),
        (5, 2, b""),
        (6, 2, b"\x08\x07"),
        (7, 2, b"\x01\xac\x02\x00"),
    ]
    assert to_int64(UINT64_MAX - 1) == -2
    assert unpack_varints(b"\x01\xac\x02\x00") == [1, 300, 0]


@pytest.mark.parametrize(
    "data",
    [
        b"\x08",  # varint field without its value
        b"\x08\x80",  # varint cut short
        b"\x12\x05abc",  # length beyond the end
        b"\x09\x00\x00",  # fixed64 cut short
        b"\x0b",  # group start: not supported
        b"\x00\x01",  # field number 0
        b"\x08" + b"\xff" * 10 + b"\x01",  # varint longer than ten bytes
    ],
)
def test_reader_rejects_malformed_input(data: bytes) -> None:
    with pytest.raises(ValueError):
        list(iter_fields(data))


def test_reader_reads_fixed_width_fields() -> None:
    data = b"\x09" + (5).to_bytes(8, "little") + b"\x15" + (6).to_bytes(4, "little")
    assert list(iter_fields(data)) == [(1, 1, 5), (2, 5, 6)]


# --- the profile ------------------------------------------------------------------


def test_output_is_gzip_and_deterministic() -> None:
    samples = [HeapSample([LEAK, HANDLE, MODULE], count=3, size=300)]
    data = encode_heap_profile(samples, mode="exact", sample_interval=0, time_nanos=T0)
    assert data[:2] == b"\x1f\x8b"
    raw = gzip.decompress(data)
    assert decode_profile(raw) == decode_profile(data)  # accepts both forms
    again = encode_heap_profile(samples, mode="exact", sample_interval=0, time_nanos=T0)
    assert again == data  # gzip mtime is fixed: same snapshot, same bytes


def test_every_profile_field() -> None:
    samples = [
        HeapSample([LEAK, HANDLE, MODULE], count=1000, size=8_000_000),
        HeapSample([("cache.py", 7, "Cache.fill"), HANDLE, MODULE], count=50, size=1_000_000),
    ]
    profile = encode(
        samples,
        mode="sample",
        sample_interval=524_288,
        duration_nanos=5_000_000_000,
        comments=["heapwatch 0.1.0", "pid 42"],
    )
    assert [
        (string(profile, t["type"]), string(profile, t["unit"])) for t in profile["sample_type"]
    ] == [
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]
    assert string(profile, profile["default_sample_type"]) == "inuse_space"
    period_type = profile["period_type"]
    assert (string(profile, period_type["type"]), string(profile, period_type["unit"])) == (
        "space",
        "bytes",
    )
    assert profile["period"] == 524_288
    assert profile["time_nanos"] == T0
    assert profile["duration_nanos"] == 5_000_000_000
    assert [string(profile, c) for c in profile["comment"]] == ["heapwatch 0.1.0", "pid 42"]
    assert profile["drop_frames"] == profile["keep_frames"] == 0

    assert profile["string_table"][0] == ""
    assert len(set(profile["string_table"])) == len(profile["string_table"])

    (mapping,) = profile["mapping"]
    assert mapping["id"] == 1
    assert string(profile, mapping["filename"]) == pprof.PYTHON_MAPPING
    assert mapping["has_functions"] and mapping["has_filenames"] and mapping["has_line_numbers"]
    assert not mapping["has_inline_frames"]
    assert mapping["memory_start"] == mapping["memory_limit"] == mapping["file_offset"] == 0
    assert mapping["build_id"] == 0

    for location in profile["location"]:
        assert location["mapping_id"] == 1
        assert location["address"] == 0
        assert not location["is_folded"]
        assert len(location["line"]) == 1  # Python has no inlining
    for function in profile["function"]:
        # No system_name: see the comment in _ProfileBuilder._function.
        assert function["system_name"] == 0
        assert function["start_line"] == 0

    assert stacks(profile) == [
        (
            [("grow", "leaky.py", 42), ("handle", "app.py", 10), ("<module>", "app.py", 3)],
            [1000, 8_000_000],
        ),
        (
            [("Cache.fill", "cache.py", 7), ("handle", "app.py", 10), ("<module>", "app.py", 3)],
            [50, 1_000_000],
        ),
    ]
    assert all(sample["label"] == [] for sample in profile["sample"])


def test_exact_mode_has_no_period() -> None:
    profile = encode([HeapSample([LEAK], 1, 10)], mode="exact", sample_interval=4096)
    assert profile["period"] == 0
    assert profile["period_type"] is not None  # the kind of events is still space


def test_time_defaults_to_now() -> None:
    import time

    before = time.time_ns()
    data = encode_heap_profile([], mode="exact", sample_interval=0)
    after = time.time_ns()
    assert before <= decode_profile(data)["time_nanos"] <= after


def test_empty_input_is_a_valid_profile() -> None:
    profile = encode([], duration_nanos=0, comments=())
    assert profile["sample"] == profile["location"] == profile["function"] == []
    assert len(profile["sample_type"]) == 2
    assert profile["string_table"][0] == ""
    assert profile["duration_nanos"] == 0
    assert profile["comment"] == []


def test_locations_functions_and_strings_are_deduplicated() -> None:
    samples = [
        HeapSample([LEAK, HANDLE, MODULE], 1, 10),
        HeapSample([LEAK, ("app.py", 11, "handle"), MODULE], 2, 20),  # same function, other line
        HeapSample([LEAK, ("other.py", 10, "handle"), MODULE], 3, 30),  # same name, other file
        HeapSample([LEAK, HANDLE, MODULE], 4, 40),  # same traceback again: kept apart
    ]
    profile = encode(samples)
    # Locations are (file, line, function); functions are (name, file).
    assert len(profile["location"]) == 5
    assert len(profile["function"]) == 4
    assert [s["location_id"] for s in profile["sample"]] == [
        [1, 2, 3],
        [1, 4, 3],
        [1, 5, 3],
        [1, 2, 3],
    ]
    function_of = {loc["id"]: loc["line"][0]["function_id"] for loc in profile["location"]}
    assert function_of[2] == function_of[4] != function_of[5]
    assert profile["string_table"].count("handle") == 1
    assert profile["string_table"].count("app.py") == 1
    assert len(set(profile["string_table"])) == len(profile["string_table"])
    assert [s["value"] for s in profile["sample"]] == [[1, 10], [2, 20], [3, 30], [4, 40]]


def test_ids_follow_first_appearance_leaf_first() -> None:
    profile = encode([HeapSample([("c.py", 3, "c"), ("b.py", 2, "b"), ("a.py", 1, "a")], 1, 1)])
    assert [loc["id"] for loc in profile["location"]] == [1, 2, 3]
    assert [f["id"] for f in profile["function"]] == [1, 2, 3]
    (sample,) = profile["sample"]
    assert sample["location_id"] == [1, 2, 3]  # leaf (most recent call) first
    assert [frame[0] for frame in stacks(profile)[0][0]] == ["c", "b", "a"]


def test_unknown_names_and_empty_tracebacks() -> None:
    samples = [
        HeapSample([("", 5, "")], 1, 10),
        HeapSample([(None, 6, None)], 1, 10),  # type: ignore[list-item]
        HeapSample([], 1, 10),
        HeapSample([(UNKNOWN, 0, UNKNOWN)], 1, 10),
    ]
    profile = encode(samples)
    assert [frames for frames, _ in stacks(profile)] == [
        [(UNKNOWN, UNKNOWN, 5)],
        [(UNKNOWN, UNKNOWN, 6)],
        [(UNKNOWN, UNKNOWN, 0)],
        [(UNKNOWN, UNKNOWN, 0)],
    ]
    # "" and None normalise to the same location as an explicit <unknown>.
    assert len(profile["location"]) == 3
    assert len(profile["function"]) == 1


def test_huge_values_saturate_at_int64_max() -> None:
    samples = [
        HeapSample([LEAK], count=INT64_MAX, size=INT64_MAX),
        HeapSample([LEAK], count=UINT64_MAX, size=2**100),
        HeapSample([LEAK], count=0, size=0),
    ]
    profile = encode(samples)
    assert [s["value"] for s in profile["sample"]] == [
        [INT64_MAX, INT64_MAX],
        [INT64_MAX, INT64_MAX],
        [0, 0],
    ]


@pytest.mark.parametrize(("count", "size"), [(-1, 0), (0, -1)])
def test_negative_values_are_rejected(count: int, size: int) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        encode_heap_profile([HeapSample([LEAK], count, size)], mode="exact", sample_interval=0)


def test_non_ascii_and_surrogate_strings() -> None:
    # "\udcff" is what os.fsdecode() makes of the byte 0xff in a file name.
    samples = [
        HeapSample([("/srv/café/模块.py", 1, "Größe.ñ")], 1, 1),
        HeapSample([("/srv/bad\udcff.py", 2, "f\ud800")], 1, 1),
    ]
    data = encode_heap_profile(samples, mode="exact", sample_interval=0)
    profile = decode_profile(data)  # decodes strictly: every string is valid UTF-8
    assert [frames for frames, _ in stacks(profile)] == [
        [("Größe.ñ", "/srv/café/模块.py", 1)],
        [("f\\ud800", "/srv/bad\\udcff.py", 2)],
    ]


def test_domain_and_truncation_labels() -> None:
    samples = [
        HeapSample([LEAK], 1, 10),
        HeapSample([LEAK], 1, 10, domain=389_047),
        HeapSample([LEAK, HANDLE], 1, 10, total_nframe=2),  # complete: no label
        HeapSample([LEAK, HANDLE], 1, 10, domain=7, total_nframe=25),
    ]
    profile = encode(samples)
    assert [labels(profile, s) for s in profile["sample"]] == [
        {},
        {"domain": 389_047},
        {},
        {"domain": 7, "total_nframe": 25},
    ]
    for sample in profile["sample"]:
        for label in sample["label"]:
            assert label["str"] == label["num_unit"] == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "fast", "sample_interval": 1}, "mode must be"),
        ({"mode": "sample", "sample_interval": 0}, "positive sample_interval"),
        ({"mode": "sample", "sample_interval": -5}, "positive sample_interval"),
        ({"mode": "exact", "sample_interval": 0, "duration_nanos": -1}, "duration_nanos"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_heap_profile([], **kwargs)


@pytest.mark.parametrize(
    "frame", [("a.py", 1), ("a.py", 1, "f", "extra"), "a.py", ["a.py", 1, "f"], ("a.py", "1", "f")]
)
def test_malformed_frame(frame: Any) -> None:
    with pytest.raises(ValueError, match="a frame must be"):
        encode_heap_profile([HeapSample([frame], 1, 1)], mode="exact", sample_interval=0)


def test_samples_may_be_a_generator() -> None:
    profile = encode(HeapSample([LEAK], i, i * 10) for i in range(1, 4))  # type: ignore[arg-type]
    assert [s["value"] for s in profile["sample"]] == [[1, 10], [2, 20], [3, 30]]


def test_heap_samples_from_core_tracebacks() -> None:
    rows: list[tuple[int, tuple[tuple[object, ...], ...], int, int, int]] = [
        (0, (("leaky.py", 42, "grow"), ("app.py", 10, "handle")), 5, 4096, 2),
        (389_047, (("x.py", 1),), 1, 10, 1),  # names=False frames
        (0, (("y.py", 2, None),), 1, 20, 1),
    ]
    samples = list(heap_samples_from_tracebacks(rows))
    assert samples == [
        HeapSample(
            frames=(("leaky.py", 42, "grow"), ("app.py", 10, "handle")),
            count=2,
            size=4096,
            domain=0,
            total_nframe=5,
        ),
        HeapSample(
            frames=(("x.py", 1, UNKNOWN),), count=1, size=10, domain=389_047, total_nframe=1
        ),
        HeapSample(frames=(("y.py", 2, UNKNOWN),), count=1, size=20, domain=0, total_nframe=1),
    ]


def test_decoder_accepts_unpacked_repeated_fields_and_skips_unknown_ones() -> None:
    sample = ProtoWriter()
    sample.int_field(1, 1)  # location_id, unpacked
    sample.int_field(1, 2)
    sample.packed_field(2, [3])  # value, packed...
    sample.int_field(2, 4)  # ...then one more unpacked
    sample.int_field(99, 5)  # unknown: skipped
    profile = ProtoWriter()
    profile.message_field(2, sample)
    profile.bytes_field(6, b"")
    profile.int_field(9, -1)
    decoded = decode_profile(profile.getvalue())
    assert decoded["sample"] == [{"location_id": [1, 2], "value": [3, 4], "label": []}]
    assert decoded["string_table"] == [""]
    assert decoded["time_nanos"] == -1
    assert decoded["period_type"] is None


def test_decoder_rejects_wrong_wire_types_and_bad_utf8() -> None:
    with pytest.raises(ValueError, match="length-delimited"):
        decode_profile(b"\x30\x01")  # string_table as a varint
    with pytest.raises(ValueError, match="wire type"):
        decode_profile(b"\x4a\x01\x00")  # time_nanos as bytes
    with pytest.raises(ValueError):
        decode_profile(b"\x32\x01\xff")  # string_table entry not UTF-8


def test_heapwatch_exporters_pprof_keeps_its_names() -> None:
    # The module first published the format; it now re-exports it.
    from heapwatch_exporters import pprof as first_home

    assert first_home.__all__ == pprof.__all__
    for name in pprof.__all__:
        assert getattr(first_home, name) is getattr(pprof, name)


def test_allocs_profile_has_gos_four_sample_types_in_gos_order() -> None:
    frame = ("app.py", 3, "churn")
    sample = HeapSample((frame,), count=2, size=200, alloc_count=7, alloc_size=7_000)
    for default in ("inuse_space", "alloc_space"):
        profile = encode([sample], allocs=True, default_sample_type=default)
        types = [
            (string(profile, t["type"]), string(profile, t["unit"])) for t in profile["sample_type"]
        ]
        assert types == [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ]
        assert string(profile, profile["default_sample_type"]) == default
        assert profile["sample"][0]["value"] == [7, 7_000, 2, 200]


def test_a_default_sample_type_the_profile_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match=r"default_sample_type must be one of .*'alloc_space'"):
        encode([], default_sample_type="alloc_space")


def test_folded_totals_are_one_sample_of_their_own() -> None:
    assert pprof.folded_sample((0, 0, 0)) is None
    folded = pprof.folded_sample((5_000, 40, 3))
    assert folded is not None
    profile = encode([folded], allocs=True)
    ((frames, values),) = stacks(profile)
    assert frames[0][0] == pprof.FOLDED_SITES
    assert values == [40, 5_000, 0, 0]


def test_core_rows_with_allocation_totals() -> None:
    rows = [(0, (("a.py", 1, "f"),), 1, 100, 1, 100, 900, 9), (0, (("a.py", 1, "f"),), 1, 5, 1)]
    first, second = pprof.heap_samples_from_tracebacks(rows)
    assert (first.alloc_count, first.alloc_size, first.size) == (9, 900, 100)
    assert (second.alloc_count, second.alloc_size) == (0, 0)
