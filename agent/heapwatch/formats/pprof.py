"""heapwatch's live memory as a pprof heap profile.

:func:`encode_heap_profile` turns one snapshot's per-traceback totals into a
gzip-compressed ``profile.proto`` (https://github.com/google/pprof/blob/main/proto/profile.proto),
the format that ``go tool pprof``, Pyroscope, Parca and Grafana read. The protobuf
encoding is written by hand (:mod:`heapwatch.formats.protobuf`): no protobuf
runtime is loaded into the monitored service. ``docs/design/pprof.md`` explains the
mapping from heapwatch's data to the profile's fields.

:func:`decode_profile` reads such a profile back into plain dicts, for tests and
debugging.
"""

from __future__ import annotations

import gzip
import itertools
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from heapwatch.formats.estimates import round_count, weigher

if TYPE_CHECKING:
    from heapwatch._core import Frames, Mode, RawTrace, Snapshot

from heapwatch.formats.protobuf import (
    WIRE_LEN,
    WIRE_VARINT,
    ProtoWriter,
    encode_varint,
    iter_fields,
    to_int64,
    unpack_varints,
)

__all__ = [
    "ALLOCS_SAMPLE_TYPES",
    "FOLDED_SITES",
    "INT64_MAX",
    "PYTHON_MAPPING",
    "ROUTE_LABEL",
    "UNKNOWN",
    "HeapSample",
    "decode_profile",
    "encode_go_heap_profile",
    "encode_heap_profile",
    "folded_sample",
    "go_heap_samples",
    "heap_samples",
    "heap_samples_from_tracebacks",
    "write_pprof",
]

INT64_MAX = (1 << 63) - 1
"""Sample values are int64 in profile.proto; larger ones are saturated to this."""

UNKNOWN = "<unknown>"
"""Stands for a missing filename or function name, as in tracemalloc."""

PYTHON_MAPPING = "[python]"
"""File name of the profile's one mapping, which every location refers to."""

FOLDED_SITES = "<folded sites>"
"""The one frame of the sample that carries the allocation totals the core
folded past its cap (``Snapshot.allocs_folded``, docs/design/core.md)."""

# pprof's convention for heap profiles (Go's runtime writes the same names):
# index 0 counts events, the last one is the default.
_INUSE_SAMPLE_TYPES = (("inuse_objects", "count"), ("inuse_space", "bytes"))
ALLOCS_SAMPLE_TYPES = (("alloc_objects", "count"), ("alloc_space", "bytes"), *_INUSE_SAMPLE_TYPES)
"""Go's four heap sample types, in the order its runtime writes them."""
_DEFAULT_SAMPLE_TYPE = "inuse_space"
_PERIOD_TYPE = ("space", "bytes")
ROUTE_LABEL = "http.route"
"""The string label of a sample allocated for a request's route (issue 26):
OpenTelemetry's name, which ``pprof -tagfocus http.route=...`` selects on."""
_MODES = ("exact", "sample")
_UNKNOWN_FRAME = (UNKNOWN, 0, UNKNOWN)

# Go's runtime/pprof uses gzip's fastest level too: the encoder runs inside the
# monitored service, holding the GIL, and profiles compress well even so.
_GZIP_LEVEL = 1

# Field numbers of profile.proto.
_PROFILE_SAMPLE_TYPE = 1
_PROFILE_SAMPLE = 2
_PROFILE_MAPPING = 3
_PROFILE_LOCATION = 4
_PROFILE_FUNCTION = 5
_PROFILE_STRING_TABLE = 6
_PROFILE_TIME_NANOS = 9
_PROFILE_DURATION_NANOS = 10
_PROFILE_PERIOD_TYPE = 11
_PROFILE_PERIOD = 12
_PROFILE_COMMENT = 13
_PROFILE_DEFAULT_SAMPLE_TYPE = 14
_VALUE_TYPE_TYPE = 1
_VALUE_TYPE_UNIT = 2
_SAMPLE_LOCATION_ID = 1
_SAMPLE_VALUE = 2
_SAMPLE_LABEL = 3
_LABEL_KEY = 1
_LABEL_STR = 2
_LABEL_NUM = 3
_MAPPING_ID = 1
_MAPPING_FILENAME = 5
_MAPPING_HAS_FUNCTIONS = 7
_MAPPING_HAS_FILENAMES = 8
_MAPPING_HAS_LINE_NUMBERS = 9
_LOCATION_ID = 1
_LOCATION_MAPPING_ID = 2
_LOCATION_LINE = 4
_LINE_FUNCTION_ID = 1
_LINE_LINE = 2
_FUNCTION_ID = 1
_FUNCTION_NAME = 2
_FUNCTION_FILENAME = 4

_MAPPING_ID_PYTHON = 1


@dataclass(frozen=True)
class HeapSample:
    """The live memory allocated from one traceback.

    ``frames`` are ``(filename, lineno, function qualname)``, most recent call
    first (heapwatch's and tracemalloc's order, which is also pprof's: leaf
    first). An empty or missing filename or function name is exported as
    :data:`UNKNOWN`; no frames at all as one ``<unknown>:0`` frame.

    ``count`` and ``size`` are the live blocks and bytes (unbiased estimates in
    sampling mode), non-negative. ``domain`` is the tracemalloc domain (0 for
    Python's allocators). ``total_nframe`` is the traceback's depth before it
    was truncated to ``frames`` (0 when unknown). ``alloc_count`` and
    ``alloc_size`` are the blocks and bytes allocated there since tracing
    started (Go's ``alloc_objects`` and ``alloc_space``), written only by a
    profile encoded with ``allocs=True``.  ``route`` is the route its memory
    was allocated for (``http.route``; empty: none), a string label.
    """

    frames: Sequence[tuple[str, int, str]]
    count: int
    size: int
    domain: int = 0
    total_nframe: int = 0
    alloc_count: int = 0
    alloc_size: int = 0
    route: str = ""


def heap_samples_from_tracebacks(
    tracebacks: Iterable[Sequence[Any]], routes: Iterable[str] | None = None
) -> Iterator[HeapSample]:
    """HeapSamples from the core's ``Snapshot.tracebacks(names=True)`` rows.

    Each row is ``(domain, frames, total_nframe, size, count)``, with
    ``peaks=True`` a peak after it (ignored), with ``allocs=True`` the peak
    and then ``alloc_size, alloc_count``. Frames without a function name
    (from ``names=False``) get :data:`UNKNOWN` as their name.  ``routes``, when
    given, names each row's route (``""``: none), in the same order.
    """
    names = iter(routes) if routes is not None else None
    for row in tracebacks:
        domain, frames, total_nframe, size, count = row[:5]
        alloc_size, alloc_count = row[6:8] if len(row) >= 8 else (0, 0)
        yield HeapSample(
            frames=tuple(map(_frame_from_core, frames)),
            count=count,
            size=size,
            domain=domain,
            total_nframe=total_nframe,
            alloc_count=alloc_count,
            alloc_size=alloc_size,
            route=next(names) if names is not None else "",
        )


def folded_sample(allocs_folded: tuple[int, int, int]) -> HeapSample | None:
    """The sample of the core's folded allocation totals
    (``Snapshot.allocs_folded``: bytes, blocks, tracebacks), or None if
    nothing was folded; its one frame is :data:`FOLDED_SITES`."""
    size, blocks, _tracebacks = allocs_folded
    if blocks == 0:
        return None
    frame = (FOLDED_SITES, 0, FOLDED_SITES)
    return HeapSample((frame,), count=0, size=0, alloc_count=blocks, alloc_size=size)


def _frame_from_core(frame: tuple[object, ...]) -> tuple[str, int, str]:
    filename = frame[0]
    lineno = frame[1]
    name = frame[2] if len(frame) > 2 else None
    return (
        filename if isinstance(filename, str) else UNKNOWN,
        lineno if isinstance(lineno, int) else 0,
        name if isinstance(name, str) else UNKNOWN,
    )


def encode_heap_profile(
    samples: Iterable[HeapSample],
    *,
    mode: str,
    sample_interval: int,
    time_nanos: int | None = None,
    duration_nanos: int = 0,
    comments: Sequence[str] = (),
    allocs: bool = False,
    default_sample_type: str = _DEFAULT_SAMPLE_TYPE,
) -> bytes:
    """A gzip-compressed pprof heap profile of ``samples``.

    The profile has two sample types, ``inuse_objects``/``count`` and
    ``inuse_space``/``bytes``, or with ``allocs`` Go's four
    (:data:`ALLOCS_SAMPLE_TYPES`: ``alloc_objects`` and ``alloc_space``
    first); ``default_sample_type`` names one of them (``inuse_space``
    unless given). The period type is ``space``/``bytes``. ``mode`` is
    heapwatch's tracing mode: in ``"sample"`` mode the period is
    ``sample_interval`` (bytes between samples, > 0); in
    ``"exact"`` mode there is no period and ``sample_interval`` is ignored.

    ``time_nanos`` is when the snapshot was taken, in nanoseconds since the
    epoch (default: now); ``duration_nanos`` how long the data covers, if that
    means anything (0 omits it); ``comments`` free text shown by ``pprof
    -comments``.

    Samples keep their order and are not merged; functions, locations and
    strings are deduplicated. Counts and sizes above :data:`INT64_MAX` are
    saturated. Strings are UTF-8; a lone surrogate (a filename that was not
    valid UTF-8, decoded with ``surrogateescape``) is written as a
    ``\\udcXX`` escape, since proto3 readers reject invalid UTF-8.

    Raises ``ValueError`` for an unknown mode, a non-positive sampling interval
    in sample mode, a default sample type the profile does not have, a
    negative count or size, or a malformed frame.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, not {mode!r}")
    sample_types = ALLOCS_SAMPLE_TYPES if allocs else _INUSE_SAMPLE_TYPES
    names = tuple(name for name, _unit in sample_types)
    if default_sample_type not in names:
        raise ValueError(f"default_sample_type must be one of {names}, not {default_sample_type!r}")
    sample_interval = operator.index(sample_interval)
    if mode == "sample" and not 0 < sample_interval <= INT64_MAX:
        raise ValueError(f"sample mode needs a positive sample_interval, not {sample_interval}")
    if time_nanos is None:
        time_nanos = time.time_ns()
    duration_nanos = operator.index(duration_nanos)
    if duration_nanos < 0:
        raise ValueError(f"duration_nanos must be >= 0, not {duration_nanos}")

    builder = _ProfileBuilder(sample_types, default_sample_type)
    for sample in samples:
        builder.add_sample(sample)
    raw = builder.finish(
        period=sample_interval if mode == "sample" else 0,
        time_nanos=operator.index(time_nanos),
        duration_nanos=duration_nanos,
        comments=comments,
    )
    # mtime=0: the same snapshot gives the same bytes (cacheable, diffable).
    return gzip.compress(raw, compresslevel=_GZIP_LEVEL, mtime=0)


def go_heap_samples(
    snap: Snapshot, route_name: Callable[[int], str] | None = None
) -> list[HeapSample]:
    """A snapshot's samples as Go's heap profile has them: every traceback
    holding live memory, a peak or allocation totals, then the folded totals
    as one :data:`FOLDED_SITES` sample.  One home for the pprof profile and
    the OpenTelemetry one (``otlp_profiles.py``).  With ``route_name`` (the
    registry's), a traceback's route other than 0 is its sample's route."""
    routes = None
    if route_name is not None:
        names = {0: ""}
        routes = [
            names[rid] if rid in names else names.setdefault(rid, route_name(rid))
            for rid in snap.routes(allocs=True)
        ]
    rows = snap.tracebacks(names=True, allocs=True)
    samples = list(heap_samples_from_tracebacks(rows, routes))
    folded = folded_sample(snap.allocs_folded)
    if folded is not None:
        samples.append(folded)
    return samples


def encode_go_heap_profile(
    snap: Snapshot,
    *,
    default_sample_type: str,
    comments: Sequence[str] = (),
    time_nanos: int | None = None,
    duration_nanos: int = 0,
    route_name: Callable[[int], str] | None = None,
) -> bytes:
    """A snapshot as Go serves ``/debug/pprof/heap`` and ``/allocs``: its four
    sample types, every traceback holding live memory, a peak or allocation
    totals, and the folded totals as one :data:`FOLDED_SITES` sample, each
    labelled with its route through ``route_name`` (``go_heap_samples``).
    The one home of that profile, for the endpoints and the push exporters."""
    return encode_heap_profile(
        go_heap_samples(snap, route_name),
        mode=snap.mode,
        sample_interval=snap.sample_interval,
        time_nanos=time_nanos,
        duration_nanos=duration_nanos,
        comments=comments,
        allocs=True,
        default_sample_type=default_sample_type,
    )


def _sample_value(value: int, what: str) -> int:
    value = operator.index(value)
    if value < 0:
        raise ValueError(f"HeapSample.{what} must be >= 0, not {value}")
    # Saturate rather than fail: one absurd estimate must not cost the whole
    # profile, and int64 max bytes is already far beyond any real heap.
    return min(value, INT64_MAX)


class _ProfileBuilder:
    """Accumulates samples, interning strings, functions and locations.

    The repeated Profile fields (samples, locations, functions, strings) are
    encoded as soon as an element is first seen, into one writer per field,
    and concatenated at the end: field order is free in protobuf.
    """

    def __init__(self, sample_types: Sequence[tuple[str, str]], default_sample_type: str) -> None:
        self._sample_types = sample_types
        self._default_sample_type = default_sample_type
        self._allocs = len(sample_types) == len(ALLOCS_SAMPLE_TYPES)
        self._strings: dict[str, int] = {}
        self._functions: dict[tuple[str, str], int] = {}
        # Location ids are kept varint-encoded, ready to be joined into a
        # sample's packed location_id field: encoding each id once rather than
        # once per frame per sample makes encoding several times faster.
        self._locations: dict[tuple[str, int, str], bytes] = {}
        # The same, keyed by the frames as given, to skip their normalisation
        # on the hot path (most frames recur across tracebacks).
        self._frames: dict[object, bytes] = {}
        self._string_table = ProtoWriter()
        self._function_table = ProtoWriter()
        self._location_table = ProtoWriter()
        self._sample_table = ProtoWriter()
        self._string("")  # string_table[0] must be "".
        self._domain_key = self._string("domain")
        self._total_nframe_key = self._string("total_nframe")
        self._route_key = self._string(ROUTE_LABEL)

    def _string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self._strings)
            self._string_table.bytes_field(
                _PROFILE_STRING_TABLE, text.encode("utf-8", "backslashreplace")
            )
        return index

    def _function(self, name: str, filename: str) -> int:
        key = (name, filename)
        function_id = self._functions.get(key)
        if function_id is None:
            function_id = self._functions[key] = len(self._functions) + 1
            function = ProtoWriter()
            function.int_field(_FUNCTION_ID, function_id)
            function.int_field(_FUNCTION_NAME, self._string(name))
            # system_name stays unset on purpose: pprof "demangles" a function
            # whose system_name equals its name, and its C++ heuristics strip
            # "<...>", which turns Python's "<module>" or "<lambda>" into "".
            function.int_field(_FUNCTION_FILENAME, self._string(filename))
            # start_line is unset: frames carry the current line, not the
            # function's first line.
            self._function_table.message_field(_PROFILE_FUNCTION, function)
        return function_id

    def _location(self, frame: tuple[str, int, str]) -> bytes:
        """The varint-encoded id of ``frame``'s location, added if new."""
        try:
            filename, lineno, name = frame
        except (TypeError, ValueError):
            raise ValueError(
                f"a frame must be (filename, lineno, function), not {frame!r}"
            ) from None
        key = (filename or UNKNOWN, operator.index(lineno), name or UNKNOWN)
        encoded_id = self._locations.get(key)
        if encoded_id is None:
            location_id = len(self._locations) + 1
            encoded_id = self._locations[key] = encode_varint(location_id)
            line = ProtoWriter()
            line.int_field(_LINE_FUNCTION_ID, self._function(key[2], key[0]))
            line.int_field(_LINE_LINE, key[1])
            location = ProtoWriter()
            location.int_field(_LOCATION_ID, location_id)
            location.int_field(_LOCATION_MAPPING_ID, _MAPPING_ID_PYTHON)
            location.message_field(_LOCATION_LINE, line)
            self._location_table.message_field(_PROFILE_LOCATION, location)
        self._frames[frame] = encoded_id
        return encoded_id

    def add_sample(self, sample: HeapSample) -> None:
        frames = sample.frames or (_UNKNOWN_FRAME,)
        known = self._frames.get
        try:
            # Encoded ids are never empty, so "or" only calls _location on a miss.
            location_ids = b"".join([known(f) or self._location(f) for f in frames])
        except TypeError as exc:  # an unhashable frame (a list), a lineno not an int
            raise ValueError(
                f"a frame must be a (filename, lineno, function) tuple: {exc}"
            ) from exc
        message = ProtoWriter()
        message.bytes_field(_SAMPLE_LOCATION_ID, location_ids)
        inuse = (_sample_value(sample.count, "count"), _sample_value(sample.size, "size"))
        if self._allocs:
            allocated = (
                _sample_value(sample.alloc_count, "alloc_count"),
                _sample_value(sample.alloc_size, "alloc_size"),
            )
            message.packed_field(_SAMPLE_VALUE, allocated + inuse)
        else:
            message.packed_field(_SAMPLE_VALUE, inuse)
        if sample.domain:
            self._add_label(message, self._domain_key, operator.index(sample.domain))
        if sample.total_nframe > len(sample.frames):
            self._add_label(message, self._total_nframe_key, operator.index(sample.total_nframe))
        if sample.route:
            label = ProtoWriter()
            label.int_field(_LABEL_KEY, self._route_key)
            label.int_field(_LABEL_STR, self._string(sample.route))
            message.message_field(_SAMPLE_LABEL, label)
        self._sample_table.message_field(_PROFILE_SAMPLE, message)

    @staticmethod
    def _add_label(sample: ProtoWriter, key: int, num: int) -> None:
        label = ProtoWriter()
        label.int_field(_LABEL_KEY, key)
        label.int_field(_LABEL_NUM, num)
        sample.message_field(_SAMPLE_LABEL, label)

    def _value_type(self, type_: str, unit: str) -> ProtoWriter:
        value_type = ProtoWriter()
        value_type.int_field(_VALUE_TYPE_TYPE, self._string(type_))
        value_type.int_field(_VALUE_TYPE_UNIT, self._string(unit))
        return value_type

    def finish(
        self, *, period: int, time_nanos: int, duration_nanos: int, comments: Sequence[str]
    ) -> bytes:
        """The encoded, uncompressed Profile message."""
        profile = ProtoWriter()
        for type_, unit in self._sample_types:
            profile.message_field(_PROFILE_SAMPLE_TYPE, self._value_type(type_, unit))
        profile.extend(self._sample_table.getvalue())

        # Python frames come symbolized. One mapping that says so (has_*
        # flags), with a "[...]" name that pprof treats as a virtual object
        # like "[vdso]", keeps pprof from looking for a binary to symbolize
        # even with -symbolize=force. Pyroscope's symbolizer also wants all
        # three flags to leave a mapping alone, and rejects locations without
        # a mapping when it does run.
        mapping = ProtoWriter()
        mapping.int_field(_MAPPING_ID, _MAPPING_ID_PYTHON)
        mapping.int_field(_MAPPING_FILENAME, self._string(PYTHON_MAPPING))
        mapping.bool_field(_MAPPING_HAS_FUNCTIONS, True)
        mapping.bool_field(_MAPPING_HAS_FILENAMES, True)
        mapping.bool_field(_MAPPING_HAS_LINE_NUMBERS, True)
        profile.message_field(_PROFILE_MAPPING, mapping)

        profile.extend(self._location_table.getvalue())
        profile.extend(self._function_table.getvalue())

        # These fields intern strings too, so they are encoded before the
        # string table is appended (protobuf does not care about field order).
        tail = ProtoWriter()
        tail.int_field(_PROFILE_TIME_NANOS, time_nanos)
        tail.int_field(_PROFILE_DURATION_NANOS, duration_nanos)
        tail.message_field(_PROFILE_PERIOD_TYPE, self._value_type(*_PERIOD_TYPE))
        tail.int_field(_PROFILE_PERIOD, period)
        tail.packed_field(_PROFILE_COMMENT, [self._string(c) for c in comments])
        tail.int_field(_PROFILE_DEFAULT_SAMPLE_TYPE, self._string(self._default_sample_type))

        profile.extend(self._string_table.getvalue())
        profile.extend(tail.getvalue())
        return profile.getvalue()


# --- decoding -----------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # "int64", "uint64", "bool", "string" or "message"
    repeated: bool = False
    schema: dict[int, _Field] | None = None


_VALUE_TYPE_SCHEMA = {1: _Field("type", "int64"), 2: _Field("unit", "int64")}
_LABEL_SCHEMA = {
    1: _Field("key", "int64"),
    2: _Field("str", "int64"),
    3: _Field("num", "int64"),
    4: _Field("num_unit", "int64"),
}
_SAMPLE_SCHEMA = {
    1: _Field("location_id", "uint64", repeated=True),
    2: _Field("value", "int64", repeated=True),
    3: _Field("label", "message", repeated=True, schema=_LABEL_SCHEMA),
}
_MAPPING_SCHEMA = {
    1: _Field("id", "uint64"),
    2: _Field("memory_start", "uint64"),
    3: _Field("memory_limit", "uint64"),
    4: _Field("file_offset", "uint64"),
    5: _Field("filename", "int64"),
    6: _Field("build_id", "int64"),
    7: _Field("has_functions", "bool"),
    8: _Field("has_filenames", "bool"),
    9: _Field("has_line_numbers", "bool"),
    10: _Field("has_inline_frames", "bool"),
}
_LINE_SCHEMA = {1: _Field("function_id", "uint64"), 2: _Field("line", "int64")}
_LOCATION_SCHEMA = {
    1: _Field("id", "uint64"),
    2: _Field("mapping_id", "uint64"),
    3: _Field("address", "uint64"),
    4: _Field("line", "message", repeated=True, schema=_LINE_SCHEMA),
    5: _Field("is_folded", "bool"),
}
_FUNCTION_SCHEMA = {
    1: _Field("id", "uint64"),
    2: _Field("name", "int64"),
    3: _Field("system_name", "int64"),
    4: _Field("filename", "int64"),
    5: _Field("start_line", "int64"),
}
_PROFILE_SCHEMA = {
    1: _Field("sample_type", "message", repeated=True, schema=_VALUE_TYPE_SCHEMA),
    2: _Field("sample", "message", repeated=True, schema=_SAMPLE_SCHEMA),
    3: _Field("mapping", "message", repeated=True, schema=_MAPPING_SCHEMA),
    4: _Field("location", "message", repeated=True, schema=_LOCATION_SCHEMA),
    5: _Field("function", "message", repeated=True, schema=_FUNCTION_SCHEMA),
    6: _Field("string_table", "string", repeated=True),
    7: _Field("drop_frames", "int64"),
    8: _Field("keep_frames", "int64"),
    9: _Field("time_nanos", "int64"),
    10: _Field("duration_nanos", "int64"),
    11: _Field("period_type", "message", schema=_VALUE_TYPE_SCHEMA),
    12: _Field("period", "int64"),
    13: _Field("comment", "int64", repeated=True),
    14: _Field("default_sample_type", "int64"),
}


def decode_profile(data: bytes) -> dict[str, Any]:
    """Decode a pprof profile (gzip-compressed or not) into plain dicts.

    The result mirrors profile.proto: one key per field, named as there,
    holding an ``int``/``bool``/``str``, a list for repeated fields, a dict
    for a message (``None`` for an absent ``period_type``). String-table
    references stay indices into ``"string_table"``. Every field is present,
    absent ones with their proto3 default; fields this decoder does not know
    are skipped. Raises ``ValueError`` on malformed data, including strings
    that are not valid UTF-8.
    """
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return _decode_message(data, _PROFILE_SCHEMA)


def _default(field: _Field) -> Any:
    if field.repeated:
        return []
    if field.kind == "message":
        return None
    if field.kind == "bool":
        return False
    if field.kind == "string":
        return ""
    return 0


def _scalar(field: _Field, value: int) -> Any:
    if field.kind == "int64":
        return to_int64(value)
    if field.kind == "bool":
        return value != 0
    return value


def _decode_message(data: bytes, schema: dict[int, _Field]) -> dict[str, Any]:
    message = {field.name: _default(field) for field in schema.values()}
    for number, wire_type, value in iter_fields(data):
        field = schema.get(number)
        if field is None:
            continue
        decoded: list[Any]
        if field.kind in ("message", "string"):
            if wire_type != WIRE_LEN or not isinstance(value, bytes):
                raise ValueError(f"field {field.name} must be length-delimited")
            if field.kind == "message":
                assert field.schema is not None
                decoded = [_decode_message(value, field.schema)]
            else:
                decoded = [value.decode("utf-8")]
        elif wire_type == WIRE_VARINT and isinstance(value, int):
            decoded = [_scalar(field, value)]
        elif field.repeated and wire_type == WIRE_LEN and isinstance(value, bytes):
            decoded = [_scalar(field, v) for v in unpack_varints(value)]
        else:
            raise ValueError(f"field {field.name} has unexpected wire type {wire_type}")
        if field.repeated:
            message[field.name].extend(decoded)
        else:
            # proto3: the last occurrence of a singular field wins.
            message[field.name] = decoded[-1]
    return message


def heap_samples(
    traces: Iterable[RawTrace],
    mode: str,
    sample_interval: int,
    routes: Iterable[str] | None = None,
) -> list[HeapSample]:
    """One pprof sample per distinct (domain, traceback, route), with
    estimated bytes and blocks.  Dumps keep no function names: a frame's
    function is named after its ``file:line``, so that pprof's default (by
    function) views still tell the lines apart.  ``routes``, when given,
    names each trace's route (``""``: none), in the same order."""
    weigh = weigher(cast("Mode", mode), sample_interval)
    sums: dict[tuple[int, Frames, int, str], list[int]] = {}
    names = iter(routes) if routes is not None else itertools.repeat("")
    for (domain, size, frames, total_nframe), route in zip(traces, names):
        est_size, count_fp = weigh(size)
        key = (domain, frames, total_nframe, route)
        acc = sums.get(key)
        if acc is None:
            sums[key] = [est_size, count_fp]
        else:
            acc[0] += est_size
            acc[1] += count_fp
    samples = []
    for (domain, frames, total_nframe, route), (size, count_fp) in sums.items():
        named = tuple((filename, lineno, f"{filename}:{lineno}") for filename, lineno in frames)
        samples.append(
            HeapSample(named, round_count(count_fp), size, domain, total_nframe, route=route)
        )
    return samples


def write_pprof(
    fp: BinaryIO,
    traces: Iterable[RawTrace],
    mode: str,
    sample_interval: int,
    *,
    time_nanos: int | None = None,
    comments: Sequence[str] = (),
    routes: Iterable[str] | None = None,
) -> None:
    """Writes the traces as a gzip pprof heap profile (``inuse_objects``,
    ``inuse_space``; the sampling period in sample mode), each labelled with
    its route's name (``routes``, in the traces' order) as the live profile
    is (``ROUTE_LABEL``)."""
    fp.write(
        encode_heap_profile(
            heap_samples(traces, mode, sample_interval, routes),
            mode=mode,
            sample_interval=sample_interval,
            time_nanos=time_nanos,
            comments=comments,
        )
    )
