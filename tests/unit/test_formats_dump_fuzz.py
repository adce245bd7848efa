"""Fuzzing heapwatch.formats.dump with hypothesis: anything the reader is given
either reads as a dump or raises DumpError, fast; nothing else, ever.

Example counts are moderate (HEAPWATCH_FUZZ_EXAMPLES, default 200, raises
them for a long run); failures hypothesis finds become explicit regression
tests in test_formats_dump.py.
"""

from __future__ import annotations

import io
import os
import re
import time

from _dumpcraft import (
    END,
    STRING,
    TRACE,
    TRACE_DOMAIN,
    TRACEBACK,
    U64_MAX,
    age_record,
    assemble,
    end_record,
    header_payload,
    header_record,
    preamble,
    string_record,
    trace_record,
    traceback_record,
    varint,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from heapwatch.formats.dump import (
    AgeClock,
    Dump,
    DumpError,
    DumpHeader,
    RawTrace,
    iter_dump,
    read_dump,
    write_dump,
)

FUZZ = settings(
    max_examples=int(os.environ.get("HEAPWATCH_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SECONDS_PER_CASE = 2.0

# Lone surrogates (surrogateescape'd bytes) are rare in hypothesis's default
# alphabet: mix them in on purpose.
CHARS = st.one_of(
    st.characters(exclude_categories=()),
    st.sampled_from(["\udcff", "\udc80", "\ud800", "\udfff", "\ud83d", "\x00", "\u00e9"]),
)
TEXT = st.text(CHARS, max_size=12)
U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, U64_MAX)
SIZES = st.one_of(st.integers(0, 300), st.integers(0, 20_000), U64)
DOMAINS = st.one_of(st.just(0), st.just(0), U32)

FRAMES = st.lists(st.tuples(TEXT, st.one_of(st.integers(0, 200), U32)), min_size=1, max_size=6).map(
    tuple
)
TRACEBACKS = st.lists(st.tuples(FRAMES, st.integers(0, 0xFFFF)), min_size=1, max_size=6)


@st.composite
def traces(draw: st.DrawFn, max_size: int = 40) -> list[RawTrace]:
    pool = draw(TRACEBACKS)
    picks = draw(
        st.lists(st.tuples(DOMAINS, SIZES, st.integers(0, len(pool) - 1)), max_size=max_size)
    )
    return [(domain, size, pool[i][0], pool[i][1]) for domain, size, i in picks]


FINITE = st.floats(allow_nan=False, allow_infinity=False)
CLOCKS = st.builds(
    AgeClock,
    st.one_of(st.integers(0, 40), U64),
    FINITE,
    st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
)


@st.composite
def headers(draw: st.DrawFn) -> DumpHeader:
    mode = draw(st.sampled_from(["exact", "sample"]))
    return DumpHeader(
        python_version=draw(TEXT),
        pid=draw(st.one_of(st.integers(0, 2**22), U64)),
        timestamp=draw(st.floats(allow_nan=False, allow_infinity=False)),
        mode=mode,
        sample_interval=0 if mode == "exact" else draw(st.integers(1, U64_MAX)),
        traceback_limit=draw(st.integers(1, 0xFFFF)),
        extra=draw(st.dictionaries(TEXT, TEXT, max_size=4)),
        ages=draw(st.one_of(st.none(), CLOCKS)),
    )


def ages_of(header: DumpHeader, items: list[RawTrace]) -> list[int] | None:
    """The ages written with items: runs of one age, changing, within the epoch."""
    if header.ages is None:
        return None
    return [(i // 3 * 7) % (header.ages.epoch + 1) for i in range(len(items))]


def write(
    header: DumpHeader, items: list[RawTrace], compress: bool, ages: list[int] | None = None
) -> bytes:
    out = io.BytesIO()
    if header.ages is not None:
        paired = zip(items, ages_of(header, items) if ages is None else ages)
        write_dump(out, header, paired, compress=compress)  # an iterator, streamed
    else:
        write_dump(out, header, iter(items), compress=compress)  # a generator, streamed
    return out.getvalue()


def expected(header: DumpHeader, items: list[RawTrace]) -> Dump:
    return Dump(header, items, ages_of(header, items))


def outcome(data: bytes) -> Dump | DumpError:
    """What reading data gives: a Dump or a DumpError (any other exception
    fails the test), in both readers, which must agree, within the time limit."""
    started = time.perf_counter()
    try:
        dump: Dump | DumpError = read_dump(io.BytesIO(data))
    except DumpError as exc:
        dump = exc
    try:
        header, it = iter_dump(io.BytesIO(data), ages=True)
        pairs = list(it)
        ages = None if header.ages is None else [age for _trace, age in pairs]
        streamed: Dump | DumpError = Dump(header, [trace for trace, _age in pairs], ages)  # type: ignore[arg-type]
    except DumpError as exc:
        streamed = exc
    assert time.perf_counter() - started < SECONDS_PER_CASE
    if isinstance(dump, Dump):
        assert streamed == dump
    else:
        assert isinstance(streamed, DumpError)
        assert str(dump), "a DumpError says what is wrong"
    return dump


def note_outcome(result: Dump | DumpError) -> None:
    """Tells --hypothesis-show-statistics which checks the fuzzer reaches."""
    if isinstance(result, Dump):
        event(f"read: {len(result.traces)} traces" if result.traces else "read: no traces")
    else:
        message = re.sub(r"0x[0-9a-f]+|\d+", "N", str(result).split(": ", 2)[-1])
        event("refused: " + " ".join(message.split()[:5]).rstrip(":,"))


def assert_rewrites(dump: Dump) -> None:
    """Whatever the reader accepts, the writer writes back identically."""
    for compress in (False, True):
        again = outcome(write(dump.header, dump.traces, compress, dump.ages))
        assert again == dump


# --------------------------------------------------------------------------
# round trips


@FUZZ
@given(headers(), traces(), st.booleans())
def test_round_trip(header: DumpHeader, items: list[RawTrace], compress: bool) -> None:
    assert outcome(write(header, items, compress)) == expected(header, items)


# --------------------------------------------------------------------------
# garbage


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes(data: bytes) -> None:
    assert isinstance(outcome(data), DumpError)


@FUZZ
@given(st.sampled_from([0, 1]), st.binary(max_size=4096))
def test_random_bytes_after_a_valid_preamble(compression: int, body: bytes) -> None:
    result = outcome(preamble(compression=compression) + body)
    assert isinstance(result, DumpError)


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_compressed_after_a_valid_preamble(body: bytes) -> None:
    import zlib

    assert isinstance(outcome(preamble(compression=1) + zlib.compress(body)), DumpError)


# --------------------------------------------------------------------------
# damaged dumps


@FUZZ
@given(headers(), traces(), st.booleans(), st.data())
def test_truncation_is_an_error(
    header: DumpHeader, items: list[RawTrace], compress: bool, data: st.DataObject
) -> None:
    dump = write(header, items, compress)
    cut = data.draw(st.integers(0, len(dump) - 1))
    result = outcome(dump[:cut])
    assert isinstance(result, DumpError)
    assert "truncated" in str(result) or "empty" in str(result)


@FUZZ
@given(headers(), traces(max_size=10), st.booleans())
def test_every_truncation_of_a_random_dump(
    header: DumpHeader, items: list[RawTrace], compress: bool
) -> None:
    dump = write(header, items, compress)
    for cut in range(0, len(dump), max(1, len(dump) // 64)):
        assert isinstance(outcome(dump[:cut]), DumpError)


@FUZZ
@given(headers(), traces(), st.booleans(), st.data())
def test_bit_flips_are_detected(
    header: DumpHeader, items: list[RawTrace], compress: bool, data: st.DataObject
) -> None:
    dump = write(header, items, compress)
    flips = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(dump) - 1), st.integers(0, 7)), min_size=1, max_size=4
        )
    )
    damaged = bytearray(dump)
    for index, bit in flips:
        damaged[index] ^= 1 << bit
    result = outcome(bytes(damaged))
    if bytes(damaged) == dump or (compress and isinstance(result, Dump)):
        # Flips that cancel out, or land in deflate's ignored padding bits.
        assert result == expected(header, items)
    else:
        assert isinstance(result, DumpError)


@FUZZ
@given(headers(), traces(), st.booleans(), st.data())
def test_byte_overwrites_insertions_and_deletions(
    header: DumpHeader, items: list[RawTrace], compress: bool, data: st.DataObject
) -> None:
    damaged = bytearray(write(header, items, compress))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(damaged) - 1))
        action = data.draw(st.sampled_from(["overwrite", "insert", "delete"]))
        if action == "overwrite":
            damaged[index] = data.draw(st.integers(0, 255))
        elif action == "insert":
            damaged[index:index] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del damaged[index : index + data.draw(st.integers(1, 8))]
    result = outcome(bytes(damaged))
    if isinstance(result, Dump):
        # only when the edits cancel out (or touch deflate's padding)
        assert result == expected(header, items)


# --------------------------------------------------------------------------
# hostile dumps: well-formed framing and a valid checksum around hostile
# records, so that the reader's checks (not the CRC) must catch them


HOSTILE_INT = st.one_of(
    st.integers(0, 3),
    st.integers(0, 300),
    st.sampled_from([0xFFFF, 0x10000, 2**32 - 1, 2**32, 2**63, U64_MAX, 2**64, 2**70]),
    st.integers(0, 2**72),
)


def records() -> st.SearchStrategy[bytes]:
    small = st.integers(0, 5)
    return st.one_of(
        st.builds(string_record, TEXT),
        st.builds(string_record, st.binary(max_size=16)),
        st.builds(
            lambda n, tail: bytes([STRING]) + varint(n) + tail, HOSTILE_INT, st.binary(max_size=8)
        ),
        st.builds(
            traceback_record,
            st.lists(st.tuples(small, st.one_of(small, HOSTILE_INT)), min_size=1, max_size=4),
            st.one_of(st.none(), small, HOSTILE_INT),
        ),
        st.builds(
            lambda n, tail: bytes([TRACEBACK]) + varint(n) + tail,
            HOSTILE_INT,
            st.binary(max_size=12),
        ),
        st.builds(trace_record, st.one_of(small, HOSTILE_INT), st.one_of(small, HOSTILE_INT)),
        st.builds(
            trace_record,
            st.one_of(small, HOSTILE_INT),
            st.one_of(small, HOSTILE_INT),
            st.one_of(st.integers(1, 5), HOSTILE_INT),
        ),
        st.builds(
            lambda a, b, c: bytes([TRACE_DOMAIN]) + varint(a) + varint(b) + varint(c),
            small,
            HOSTILE_INT,
            HOSTILE_INT,
        ),
        st.builds(
            end_record,
            st.one_of(small, HOSTILE_INT),
            st.one_of(small, HOSTILE_INT),
            st.one_of(small, HOSTILE_INT),
        ),
        st.builds(
            lambda tag, n, tail: bytes([tag]) + varint(n) + tail,
            st.integers(0x80, 0xFF),
            st.one_of(small, HOSTILE_INT),
            st.binary(max_size=8),
        ),
        st.builds(header_record, st.builds(header_payload)),
        st.builds(age_record, st.one_of(small, HOSTILE_INT)),
        st.builds(
            lambda n, tail: bytes([0x80]) + varint(n) + tail, HOSTILE_INT, st.binary(max_size=4)
        ),
        st.builds(bytes, st.lists(st.integers(0, 255), max_size=6)),
        st.sampled_from([bytes([END]), bytes([TRACE]), b"\xff" * 11, b"\x04\x80\x80\x80"]),
    )


@st.composite
def valid_records(draw: st.DrawFn) -> list[bytes]:
    """The records of a valid dump, built by hand: strings, then tracebacks
    and traces that refer to what is defined, then a correct end record."""
    clock = draw(
        st.one_of(
            st.none(),
            st.builds(AgeClock, st.integers(0, 5), FINITE, CLOCKS.map(lambda c: c.interval)),
        )
    )
    aged = DumpHeader("3.11.7", 4242, 1.5, "exact", 0, 10, {}, ages=clock)
    body = [header_record(header_payload(aged))]
    nstrings = draw(st.integers(1, 4))
    body += [string_record(draw(TEXT)) for _ in range(nstrings)]
    ntracebacks = draw(st.integers(1, 3))
    for _ in range(ntracebacks):
        frames = draw(
            st.lists(
                st.tuples(st.integers(0, nstrings - 1), st.integers(0, 2**32 - 1)),
                min_size=1,
                max_size=4,
            )
        )
        body.append(traceback_record(frames, draw(st.integers(0, 0xFFFF))))
    ntraces = draw(st.integers(0, 8))
    for i in range(ntraces):
        if clock is not None and (i == 0 or draw(st.booleans())):
            body.append(age_record(draw(st.integers(0, clock.epoch))))
        body.append(trace_record(draw(st.integers(0, ntracebacks - 1)), draw(SIZES), draw(DOMAINS)))
    body.append(end_record(nstrings, ntracebacks, ntraces))
    return body


@st.composite
def hostile_dumps(draw: st.DrawFn) -> bytes:
    """A valid dump with hostile records swapped in or inserted, then
    framed with a correct checksum."""
    body = draw(valid_records())
    for _ in range(draw(st.integers(0, 3))):
        index = draw(st.integers(0, len(body)))
        if draw(st.booleans()) and index < len(body):
            body[index] = draw(records())
        else:
            body.insert(index, draw(records()))
    minor = draw(st.sampled_from([0, 0, 1, 255]))
    compress = draw(st.booleans())
    return assemble(body, pre=preamble(minor=minor, compression=int(compress)), compress=compress)


@FUZZ
@given(hostile_dumps())
def test_hostile_records_with_valid_checksums(data: bytes) -> None:
    result = outcome(data)
    note_outcome(result)
    if isinstance(result, Dump):
        assert_rewrites(result)


@FUZZ
@given(
    st.sampled_from(
        ["string", "traceback", "frame", "trace", "domain", "extension", "header", "extra", "end"]
    ),
    HOSTILE_INT,
    st.binary(max_size=64),
    st.booleans(),
)
def test_hostile_lengths_and_counts(where: str, value: int, tail: bytes, compress: bool) -> None:
    """A hostile number where the format has a length, count or id, followed
    by a little data: never allocated from, never looped on."""
    base = [header_record(), string_record("a.py"), traceback_record([(0, 1)])]
    hostile = {
        "string": bytes([STRING]) + varint(value),
        "traceback": bytes([TRACEBACK]) + varint(value) + varint(1),
        "frame": bytes([TRACEBACK]) + varint(2) + varint(2) + varint(0) + varint(1) + varint(value),
        "trace": bytes([TRACE]) + varint(value) + varint(8),
        "domain": bytes([TRACE_DOMAIN]) + varint(0) + varint(value) + varint(8),
        "extension": bytes([0x90]) + varint(value),
        "header": bytes([0x01]) + varint(value),
        "extra": header_record(header_payload()[:-11] + varint(value)),
        "end": end_record(value, value, value),
    }[where]
    if where in ("header", "extra"):
        base = []
    result = outcome(assemble([*base, hostile + tail], compress=compress))
    note_outcome(result)
    if isinstance(result, Dump):
        assert_rewrites(result)
