"""Ages in dumps (format 1.1): each trace's age in epochs and the clock that
turns epochs into durations, written, read back, refused when malformed;
dumps of format 1.0 still load, without ages."""

from __future__ import annotations

import io
import math
import struct
from pathlib import Path

import pytest
from _dumpcraft import (
    AGE,
    HDR,
    age_record,
    assemble,
    end_record,
    header_payload,
    header_record,
    now_header,
    preamble,
    string_record,
    trace_record,
    traceback_record,
    varint,
)

from heapwatch.formats.dump import (
    AgeClock,
    AgedTrace,
    DumpError,
    DumpHeader,
    RawTrace,
    iter_dump,
    read_dump,
    write_dump,
)

OLD_DUMP = Path(__file__).parent.parent / "data" / "dump-format-1.0.hwdump"
CLOCK = AgeClock(epoch=12, started=1_700_000_000.0, interval=10.0)
A = (("app.py", 10), ("main.py", 3))
B = (("lib.py", 7),)
# Ages that change, repeat, and come back; a trace in another domain.
AGED: list[AgedTrace] = [
    ((0, 100, A, 2), 12),
    ((0, 100, A, 2), 12),
    ((0, 4000, B, 1), 0),
    ((5, 300, B, 1), 0),
    ((0, 100, A, 2), 3),
    ((0, 1 << 40, A, 2), 12),
]
MODES = pytest.mark.parametrize(
    ("mode", "interval"), [("exact", 0), ("sample", 65536)], ids=["exact", "sample"]
)
COMPRESS = pytest.mark.parametrize("compress", [False, True], ids=["raw", "zlib"])


def aged_header(mode: str = "exact", interval: int = 0, clock: AgeClock = CLOCK) -> DumpHeader:
    return DumpHeader(
        python_version="3.12.1",
        pid=77,
        timestamp=1_700_000_042.5,
        mode=mode,
        sample_interval=interval,
        traceback_limit=5,
        extra={"trigger": "signal"},
        ages=clock,
    )


def written(header: DumpHeader, traces: object, compress: bool = False) -> bytes:
    out = io.BytesIO()
    write_dump(out, header, traces, compress=compress)  # type: ignore[arg-type]
    return out.getvalue()


def refused(data: bytes, match: str) -> DumpError:
    """Both readers raise DumpError saying what is wrong, and where."""
    with pytest.raises(DumpError, match=match) as info:
        read_dump(io.BytesIO(data))
    with pytest.raises(DumpError, match=match):
        _header, traces = iter_dump(io.BytesIO(data), ages=True)
        list(traces)
    assert "offset" in str(info.value)
    return info.value


# ---- round trips ---------------------------------------------------------------


@MODES
@COMPRESS
def test_ages_round_trip(mode: str, interval: int, compress: bool) -> None:
    # Given traces with their ages and the clock of their epochs
    header = aged_header(mode, interval)
    data = written(header, AGED, compress)
    # When the dump is read whole, streamed with ages, and streamed without
    dump = read_dump(io.BytesIO(data))
    streamed_header, pairs = iter_dump(io.BytesIO(data), ages=True)
    _plain_header, plain = iter_dump(io.BytesIO(data))
    # Then the header, the traces and each one's age come back
    assert dump.header == streamed_header == header
    assert dump.header.ages == CLOCK
    assert dump.traces == [trace for trace, _age in AGED]
    assert dump.ages == [age for _trace, age in AGED]
    assert list(pairs) == AGED
    assert list(plain) == dump.traces


def test_an_age_record_is_written_only_when_the_age_changes() -> None:
    """The writer's bytes are the spec's (dump-format.md), crafted by hand."""
    header = aged_header()
    traces: list[AgedTrace] = [((0, 10, B, 1), 4), ((0, 20, B, 1), 4), ((0, 30, B, 1), 0)]
    crafted = assemble(
        [
            header_record(header_payload(header)),
            age_record(4),
            string_record("lib.py"),
            traceback_record([(0, 7)], total_nframe=1),
            trace_record(0, 10),
            trace_record(0, 20),
            age_record(0),
            trace_record(0, 30),
            end_record(1, 1, 3),
        ]
    )
    assert written(header, traces) == crafted
    assert read_dump(io.BytesIO(crafted)).ages == [4, 4, 0]


def test_a_dump_without_ages_has_none() -> None:
    header = now_header(mode="sample", sample_interval=1024)
    traces: list[RawTrace] = [(0, 10, B, 1), (2, 20, A, 2)]
    data = written(header, traces)
    dump = read_dump(io.BytesIO(data))
    assert dump.header.ages is None
    assert dump.ages is None
    _header, pairs = iter_dump(io.BytesIO(data), ages=True)
    assert list(pairs) == [(traces[0], None), (traces[1], None)]


def test_dumps_of_format_1_0_still_load() -> None:
    """A dump the 1.0 writer wrote (tests/data, 7a1cd02) loads, without ages."""
    assert OLD_DUMP.read_bytes()[14:16] == bytes([1, 0])
    dump = read_dump(OLD_DUMP)
    assert dump.header == DumpHeader(
        python_version="3.11.7",
        pid=4242,
        timestamp=1_700_000_000.25,
        mode="sample",
        sample_interval=65536,
        traceback_limit=5,
        extra={"host": "db-1", "trigger": "signal"},
    )
    assert dump.traces == [(0, 100, A, 2), (0, 70000, B, 1), (0, 100, A, 2), (3, 4096, B, 1)]
    assert dump.ages is None
    _header, pairs = iter_dump(OLD_DUMP, ages=True)
    assert [age for _trace, age in pairs] == [None] * 4


def test_a_format_1_0_dump_may_hold_extension_0x80_which_is_skipped() -> None:
    """0x80 became the age record in 1.1; in a 1.0 dump it is an extension."""
    data = assemble(
        [
            header_record(header_payload(HDR, minor=0)),
            bytes([AGE]) + varint(3) + b"abc",
            string_record("a.py"),
            traceback_record([(0, 1)]),
            trace_record(0, 10),
            end_record(1, 1, 1),
        ],
        pre=preamble(minor=0),
    )
    dump = read_dump(io.BytesIO(data))
    assert dump.traces == [(0, 10, (("a.py", 1),), 1)]
    assert dump.ages is None


# ---- bad input -------------------------------------------------------------------


def aged_dump(records: list[bytes], header: DumpHeader | None = None, ntraces: int = 1) -> bytes:
    header = aged_header() if header is None else header
    return assemble(
        [
            header_record(header_payload(header)),
            string_record("a.py"),
            traceback_record([(0, 1)]),
            *records,
            end_record(1, 1, ntraces),
        ]
    )


def test_an_age_record_in_a_dump_without_ages_is_refused() -> None:
    data = aged_dump([age_record(1), trace_record(0, 10)], header=HDR)
    refused(data, "record #3 .age. .*header says the traces carry no ages")


@pytest.mark.parametrize("domain", [0, 9])
def test_a_trace_before_any_age_record_is_refused(domain: int) -> None:
    refused(aged_dump([trace_record(0, 10, domain)]), "a trace before any age record")


def test_an_age_beyond_the_dumps_epoch_is_refused() -> None:
    refused(aged_dump([age_record(13), trace_record(0, 10)]), "age 13 exceeds the dump's epoch 12")


@pytest.mark.parametrize(
    ("record", "match"),
    [
        (bytes([AGE]) + varint(0), "age record length 0"),
        (bytes([AGE]) + varint(11) + b"\x80" * 10 + b"\x01", "age record length 11"),
        (bytes([AGE]) + varint(2) + b"\x05\x00", "says 2 bytes, its varint takes 1"),
        (bytes([AGE]) + varint(1) + b"\x85\x00", "says 1 bytes, its varint takes 2"),
    ],
    ids=["empty", "too long", "longer than its varint", "shorter than its varint"],
)
def test_a_malformed_age_record_is_refused(record: bytes, match: str) -> None:
    refused(aged_dump([record, trace_record(0, 10)]), match)


def test_a_dump_ending_inside_an_age_record_is_refused() -> None:
    pre = preamble()
    body = header_record(header_payload(aged_header())) + bytes([AGE]) + varint(2) + b"\x85"
    refused(pre + body, "truncated")


def clock_payload(flag_and_clock: bytes) -> bytes:
    return header_payload(HDR, minor=0) + flag_and_clock


@pytest.mark.parametrize(
    ("ages", "match"),
    [
        (varint(2), "the ages flag is 2; 0 .no ages. or 1 .ages. is allowed"),
        (varint(1) + varint(5) + struct.pack("<d", 1.0), "run past"),
        (varint(1) + varint(5) + struct.pack("<dd", math.nan, 1.0), "started must be a finite"),
        (varint(1) + varint(5) + struct.pack("<dd", 1.0, -1.0), "interval must be a finite"),
        (varint(1) + varint(5) + struct.pack("<dd", 1.0, math.inf), "interval must be a finite"),
    ],
    ids=["flag", "truncated clock", "nan started", "negative interval", "infinite interval"],
)
def test_a_malformed_clock_is_refused(ages: bytes, match: str) -> None:
    data = assemble([header_record(clock_payload(ages)), end_record(0, 0, 0)])
    error = refused(data, match)
    assert "record #0 (header)" in str(error)


# ---- what the writer refuses ------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ((0, 10, B, 1), r"not a \(\(domain, size, frames, total_nframe\), age\) trace"),
        (((0, 10, B, 1), 13), "age 13 is not an int in 0..12"),
        (((0, 10, B, 1), -1), "age -1 is not an int"),
        (((0, 10, B, 1), True), "age True is not an int"),
        (((0, 10, B, 1), "3"), "age '3' is not an int"),
        (((0, 10, B, 1), None), "age None is not an int"),
    ],
)
def test_the_writer_refuses_a_trace_without_a_valid_age(item: object, match: str) -> None:
    with pytest.raises(DumpError, match=match) as info:
        written(aged_header(), [((0, 1, A, 2), 0), item])
    assert "trace #1" in str(info.value)


@pytest.mark.parametrize(
    ("clock", "match"),
    [
        (AgeClock(-1, 0.0, 1.0), "epoch must be an int"),
        (AgeClock(1, math.inf, 1.0), "started must be a finite"),
        (AgeClock(1, 0.0, -0.5), "interval must be a finite float >= 0"),
        (AgeClock(1, 0.0, True), "interval must be a finite float >= 0"),  # type: ignore[arg-type]
    ],
)
def test_the_writer_refuses_a_bad_clock(clock: AgeClock, match: str) -> None:
    with pytest.raises(DumpError, match=f"cannot write the dump header: .*{match}"):
        written(aged_header(clock=clock), [])


# ---- durations ------------------------------------------------------------------------


def test_an_age_is_at_least_the_epochs_between() -> None:
    # The current epoch began at 100 at the latest, each epoch lasts 10 s or more.
    clock = AgeClock(epoch=50, started=100.0, interval=10.0)
    assert clock.min_seconds(0, 130.0) == 0.0  # recorded a moment ago, maybe
    assert clock.min_seconds(1, 130.0) == 30.0  # before the current epoch began
    assert clock.min_seconds(4, 130.0) == 60.0  # and three whole epochs before that
    assert clock.min_seconds(1, 90.0) == 0.0  # a clock that went back: never negative
    assert clock.youngest_age(0.0, 130.0) == 0
    assert clock.youngest_age(30.0, 130.0) == 1
    assert clock.youngest_age(30.5, 130.0) == 2
    assert clock.youngest_age(60.0, 130.0) == 4
    assert clock.youngest_age(3600.0, 130.0) == 358
    # Epochs of unknown length: only the current one's start tells anything.
    unknown = AgeClock(epoch=50, started=100.0, interval=0.0)
    assert unknown.youngest_age(30.0, 130.0) == 1
    assert unknown.youngest_age(31.0, 130.0) is None


@pytest.mark.parametrize("interval", [0.05, 0.1, 1.0 / 3, 7.0, 10.0])
def test_the_youngest_age_is_the_fewest_epochs_that_are_surely_old_enough(
    interval: float,
) -> None:
    clock = AgeClock(epoch=1 << 20, started=1_000.0, interval=interval)
    for at in (1_000.0, 1_000.3, 1_009.99):
        for seconds in (0.01, 0.1, 1.0, 2.5, 10.0, 99.9, 600.0, 3600.0):
            age = clock.youngest_age(seconds, at)
            assert age is not None
            assert clock.min_seconds(age, at) >= seconds
            assert age == 0 or clock.min_seconds(age - 1, at) < seconds
