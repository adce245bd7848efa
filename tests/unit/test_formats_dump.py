"""heapwatch.dumpfile: round trips, the header, sniff, versions, and every way
a dump can be bad (crafted byte by byte with _dumpcraft).  The hypothesis
fuzzing lives in test_formats_dump_fuzz.py."""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import os
import pickle
import struct
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from _dumpcraft import (
    HDR,
    MAGIC,
    PREAMBLE_SIZE,
    SIMPLE_TRACES,
    U64_MAX,
    assemble,
    end_record,
    header_payload,
    header_record,
    now_header,
    preamble,
    simple_dump,
    string_record,
    trace_record,
    traceback_record,
    varint,
)

from heapwatch import HeapwatchError, dumpfile
from heapwatch.formats import dump
from heapwatch.formats.dump import (
    FORMAT_VERSION,
    Dump,
    DumpError,
    DumpHeader,
    RawTrace,
    iter_dump,
    read_dump,
    sniff,
    write_dump,
)
from heapwatch.formats.dump import reader as dump_reader

COMPRESS = pytest.mark.parametrize("compress", [False, True], ids=["raw", "zlib"])


def dump_bytes(
    traces: list[RawTrace], header: DumpHeader = HDR, compress: bool = False, **kwargs: object
) -> bytes:
    out = io.BytesIO()
    write_dump(out, header, traces, compress=compress, **kwargs)  # type: ignore[arg-type]
    return out.getvalue()


def load(data: bytes, **kwargs: object) -> Dump:
    return read_dump(io.BytesIO(data), **kwargs)  # type: ignore[arg-type]


def roundtrip(traces: list[RawTrace], header: DumpHeader = HDR, compress: bool = False) -> Dump:
    dump = load(dump_bytes(traces, header, compress))
    assert dump.header == header
    assert dump.traces == traces
    # the streaming reader agrees with the whole-file one
    streamed_header, it = iter_dump(io.BytesIO(dump_bytes(traces, header, compress)))
    assert streamed_header == header
    assert list(it) == traces
    return dump


def refused(data: bytes, match: str | None = None, **kwargs: object) -> DumpError:
    """read_dump and iter_dump both raise DumpError (and nothing else), fast."""
    started = time.perf_counter()
    with pytest.raises(DumpError, match=match) as info:
        load(data, **kwargs)
    with pytest.raises(DumpError, match=match):
        _header, it = iter_dump(io.BytesIO(data), **kwargs)  # type: ignore[arg-type]
        for _ in it:
            pass
    assert time.perf_counter() - started < 5
    return info.value


@contextlib.contextmanager
def peak_memory() -> Iterator[list[int]]:
    """The peak of Python allocations (stdlib tracemalloc) inside the block,
    in result[0]."""
    assert not tracemalloc.is_tracing()
    result = [0]
    tracemalloc.start()
    try:
        yield result
        result[0] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------
# round trips


@COMPRESS
def test_round_trip_simple(compress: bool) -> None:
    roundtrip(SIMPLE_TRACES, compress=compress)


@COMPRESS
def test_empty_dump(compress: bool) -> None:
    dump = roundtrip([], compress=compress)
    assert dump.traces == []


@COMPRESS
def test_reads_the_handcrafted_dump(compress: bool) -> None:
    """The crafted bytes (written from the spec) and the writer agree."""
    dump = load(simple_dump(compress))
    assert dump == Dump(HDR, SIMPLE_TRACES)
    assert dump_bytes(SIMPLE_TRACES, compress=False) == simple_dump(False)


@COMPRESS
def test_65535_frames(compress: bool) -> None:
    frames = tuple((f"mod{i % 300}.py", i) for i in range(65535))
    traces = [(0, 1, frames, 65535), (0, 2, frames[:1], 65535), (0, 3, frames, 65535)]
    roundtrip(traces, compress=compress)


def test_extreme_values() -> None:
    traces: list[RawTrace] = [
        (0, 0, (("x", 0),), 0),
        (0, U64_MAX, (("x", 0xFFFFFFFF),), 0xFFFF),
        (0xFFFFFFFF, U64_MAX, (("x", 1),), 1),
        (1, 127, (("x", 1),), 1),
        (1, 128, (("x", 1),), 1),
        (0, 16383, (("x", 1),), 1),
        (0, 16384, (("x", 1),), 1),
        (0, 1 << 63, (("x", 1),), 1),
    ]
    roundtrip(traces)
    roundtrip(traces, compress=True)


@pytest.mark.parametrize(
    "filename",
    [
        "",
        "app.py",
        "/srv/caf\udce9/app.py",  # surrogateescape'd latin-1 byte
        "\udcff\udc80",
        "\ud800",  # lone high surrogate
        "\udfff",  # lone low surrogate
        "\ud83d\ude00",  # a surrogate pair kept as two code points
        "\U0001f600 emoji",
        "nul\x00inside",
        "x" * 100_000,
    ],
)
def test_filenames_round_trip_exactly(filename: str) -> None:
    dump = roundtrip([(0, 8, ((filename, 1), ("other", 2)), 2)])
    assert dump.traces[0][2][0][0] == filename
    assert len(dump.traces[0][2][0][0]) == len(filename)


def test_many_traces_share_tracebacks() -> None:
    tracebacks = [((f"f{i}.py", i), ("main.py", 1)) for i in range(10)]
    traces: list[RawTrace] = [(0, 32 + i % 7, tracebacks[i % 10], 2) for i in range(100_000)]
    data = dump_bytes(traces)
    assert len(data) < 4 * len(traces)  # tag + id + size: 3 bytes a trace
    dump = load(data)
    assert dump.traces == traces
    # the loaded traces share one tuple per traceback (and frames, and names)
    assert len({id(trace[2]) for trace in dump.traces}) == 10
    assert len(dump_bytes(traces, compress=True)) < len(data) // 10


def test_distinct_frames_tuples_are_still_interned() -> None:
    """A producer that builds a new frames tuple per trace still gets one
    traceback per distinct (frames, total_nframe)."""
    traces: list[RawTrace] = [(0, 8, (("a.py", i % 3),), 1) for i in range(1000)]
    data = dump_bytes(traces)
    assert data.count(bytes([0x03])) >= 3  # three traceback records
    assert len(data) < 20 * 3 + 4 * 1000 + 100
    assert load(data).traces == traces


def test_same_frames_different_total_nframe() -> None:
    frames = (("a.py", 1),)
    traces: list[RawTrace] = [(0, 1, frames, 1), (0, 1, frames, 9), (0, 1, frames, 1)]
    roundtrip(traces)


_PEAK_RSS = """
def peak_rss_kib():
    # VmHWM belongs to this process image; ru_maxrss would start at the
    # parent's peak (Linux keeps it across fork and exec).
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")
"""


def rss_growth_mib(code: str) -> float:
    """How much the peak RSS of a fresh interpreter grows while it runs code
    (after importing dumpfile): a memory bound that tracemalloc, 30 times
    slower on millions of traces, cannot check in reasonable time."""
    import subprocess
    import sys
    import textwrap

    import heapwatch

    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux's /proc/self/status")
    agent = Path(heapwatch.__file__).resolve().parents[1]
    script = (
        _PEAK_RSS
        + "from heapwatch import dumpfile\n"
        + "base = peak_rss_kib()\n"
        + textwrap.dedent(code)
        + "\nprint(peak_rss_kib() - base)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(agent), str(Path(__file__).parent)])}
    result = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1]) / 1024


def test_rss_growth_measures_something() -> None:
    """The control: holding a million traces shows."""
    growth = rss_growth_mib("traces = [(0, i, (), 1) for i in range(1_000_000)]")
    assert growth > 50, growth


@COMPRESS
def test_streaming_write_of_a_generator(tmp_path: Path, compress: bool) -> None:
    """Writing a million traces from a generator needs memory for the
    distinct tracebacks only: the traces themselves would take ~110 MB."""
    path = tmp_path / "big.hwdump"
    growth = rss_growth_mib(
        f"""
        from _dumpcraft import HDR
        tracebacks = [((f"f{{i}}.py", i), ("main.py", 7)) for i in range(1000)]
        traces = ((0, i, tracebacks[i % 1000], 2) for i in range(1_000_000))
        dumpfile.write_dump({str(path)!r}, HDR, traces, compress={compress})
        """
    )
    assert growth < 24, growth
    header, it = iter_dump(path)
    assert header == HDR
    count = 0
    for count, trace in enumerate(it, 1):
        assert trace[1] == count - 1
    assert count == 1_000_000


def test_generator_round_trip() -> None:
    tracebacks = [((f"f{i}.py", i), ("main.py", 7)) for i in range(100)]

    def generate() -> Iterator[RawTrace]:
        for i in range(20_000):
            yield (i % 3, 16 + i % 1000, tracebacks[i % 100], 2)

    out = io.BytesIO()
    write_dump(out, HDR, generate())
    assert load(out.getvalue()).traces == list(generate())


def test_streaming_read_memory_is_bounded(tmp_path: Path) -> None:
    """iter_dump holds a batch, not the dump: read_dump would hold ~110 MB."""
    path = tmp_path / "big.hwdump"
    frames = (("a.py", 1),)
    write_dump(path, HDR, ((0, i, frames, 1) for i in range(1_000_000)), compress=False)
    growth = rss_growth_mib(
        f"""
        header, traces = dumpfile.iter_dump({str(path)!r})
        assert sum(1 for _ in traces) == 1_000_000
        """
    )
    assert growth < 16, growth


def test_paths_and_streams(tmp_path: Path) -> None:
    for target in (tmp_path / "p.hwdump", str(tmp_path / "s.hwdump")):
        write_dump(target, HDR, SIMPLE_TRACES)
        assert read_dump(target) == Dump(HDR, SIMPLE_TRACES)
        header, it = iter_dump(target)
        assert (header, list(it)) == (HDR, SIMPLE_TRACES)
        assert sniff(target) == "heapwatch"
    with open(tmp_path / "f.hwdump", "wb") as fp:
        fp.write(b"prefix")  # the dump is written at the stream's position
        write_dump(fp, HDR, SIMPLE_TRACES)
        assert not fp.closed
    with open(tmp_path / "f.hwdump", "rb") as fp:
        assert fp.read(6) == b"prefix"
        assert read_dump(fp) == Dump(HDR, SIMPLE_TRACES)
        assert not fp.closed


def test_iterator_closes_the_file_it_opened(tmp_path: Path) -> None:
    """Exhausted, closed early, or never started: no file is left open (the
    suite turns ResourceWarning into errors)."""
    path = tmp_path / "d.hwdump"
    write_dump(path, HDR, SIMPLE_TRACES)
    _h, it = iter_dump(path)
    list(it)
    _h, it = iter_dump(path)
    next(it)
    it.close()  # type: ignore[attr-defined]
    with iter_dump(path)[1] as it2:  # type: ignore[attr-defined]
        next(it2)
    _h, it = iter_dump(path)
    del it
    gc.collect()


def test_default_is_compressed_and_level_is_honoured() -> None:
    traces: list[RawTrace] = [(0, i % 50, (("a.py", i % 20),), 1) for i in range(5000)]
    default = dump_bytes(traces, compress=True)
    out = io.BytesIO()
    write_dump(out, HDR, traces)
    assert out.getvalue() == default
    assert out.getvalue()[len(MAGIC) + 2] == 1  # the compression byte
    assert load(dump_bytes(traces, compress=True, compresslevel=9)).traces == traces
    with pytest.raises(ValueError, match="compresslevel"):
        dump_bytes(traces, compress=True, compresslevel=10)


def test_output_is_deterministic() -> None:
    assert dump_bytes(SIMPLE_TRACES) == dump_bytes(SIMPLE_TRACES)
    assert dump_bytes(SIMPLE_TRACES, compress=True) == dump_bytes(SIMPLE_TRACES, compress=True)


# --------------------------------------------------------------------------
# the header


def test_header_fields_round_trip() -> None:
    header = DumpHeader(
        python_version="3.13.0rc1+",
        pid=2**40,
        timestamp=1_234_567_890.123456,
        mode="sample",
        sample_interval=512 * 1024,
        traceback_limit=65535,
        extra={"hostname": "web-7", "service": "caf\u00e9", "": "", "k\udcff": "v\ud800"},
    )
    for compress in (False, True):
        dump = roundtrip(SIMPLE_TRACES, header, compress)
        assert dump.header.timestamp == header.timestamp
        assert dict(dump.header.extra) == dict(header.extra)
        assert type(dump.header.timestamp) is float


def test_header_extra_defaults_to_empty() -> None:
    header = DumpHeader("3.9.0", 1, 0.0, "exact", 0, 1)
    assert header.extra == {}
    assert roundtrip([], header).header.extra == {}


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"mode": "fast"}, "mode"),
        ({"mode": "exact", "sample_interval": 4096}, "exact mode"),
        ({"mode": "sample", "sample_interval": 0}, "sample mode"),
        ({"traceback_limit": 0}, "traceback_limit"),
        ({"traceback_limit": 65536}, "traceback_limit"),
        ({"pid": -1}, "pid"),
        ({"pid": 2**64}, "pid"),
        ({"timestamp": float("nan")}, "timestamp"),
        ({"timestamp": float("inf")}, "timestamp"),
        ({"timestamp": "now"}, "timestamp"),
        ({"python_version": b"3.11"}, "python_version"),
        ({"extra": {"k": 1}}, "extra"),
        ({"extra": [("k", "v")]}, "extra"),
        ({"extra": {"k": "v" * (1 << 20 + 1)}}, "limit"),
    ],
)
def test_writer_refuses_bad_headers(changes: dict[str, object], match: str) -> None:
    with pytest.raises(DumpError, match=match):
        dump_bytes([], now_header(**changes))


# --------------------------------------------------------------------------
# writer errors


FRAMES = (("a.py", 1),)


@pytest.mark.parametrize(
    ("trace", "match"),
    [
        ((0, -1, FRAMES, 1), "size"),
        ((0, 2**64, FRAMES, 1), "size"),
        ((0, 1.5, FRAMES, 1), "trace"),
        ((0, None, FRAMES, 1), "trace"),
        ((-1, 1, FRAMES, 1), "domain"),
        ((2**32, 1, FRAMES, 1), "domain"),
        ((0, 1, (), 0), "frames"),
        ((0, 1, (("a.py", 1),) * 65536, 0), "frames"),
        ((0, 1, [("a.py", 1)], 1), "trace"),
        ((0, 1, (("a.py", -1),), 1), "lineno"),
        ((0, 1, (("a.py", 2**32),), 1), "lineno"),
        ((0, 1, ((b"a.py", 1),), 1), "filename"),
        ((0, 1, (("a.py", 1, 2),), 1), "frame"),
        ((0, 1, ("a.py",), 1), "frame"),
        ((0, 1, FRAMES, -1), "total_nframe"),
        ((0, 1, FRAMES, 65536), "total_nframe"),
        ((0, 1, FRAMES), "trace"),
        (None, "trace"),
        ((0, 1, (("x" * (1 << 20 + 1), 1),), 1), "limit"),
    ],
)
def test_writer_refuses_bad_traces(trace: object, match: str) -> None:
    traces = [(0, 1, FRAMES, 1), trace]
    with pytest.raises(DumpError, match=match) as info:
        dump_bytes(traces)  # type: ignore[arg-type]
    assert "trace #1" in str(info.value)


def test_failed_write_removes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.hwdump"
    with pytest.raises(DumpError, match="trace #2"):
        write_dump(path, HDR, [*SIMPLE_TRACES[:2], (0, -5, FRAMES, 1)])
    assert not path.exists()

    def failing() -> Iterator[RawTrace]:
        yield SIMPLE_TRACES[0]
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError, match="producer died"):
        write_dump(path, HDR, failing())
    assert not path.exists()


def test_dump_error_is_a_value_error_and_a_heapwatch_error() -> None:
    assert issubclass(DumpError, ValueError)
    assert issubclass(DumpError, HeapwatchError)


def test_public_interface() -> None:
    # heapwatch.dumpfile, the name first published, keeps every name
    assert {name: getattr(dumpfile, name) for name in dumpfile.__all__} == {
        name: getattr(dump, name) for name in dumpfile.__all__
    }
    assert (
        set(dumpfile.__all__)
        == set(dump.__all__)
        == {
            "FORMAT_VERSION",
            "AgeClock",
            "AgedTrace",
            "Dump",
            "DumpError",
            "DumpHeader",
            "RawTrace",
            "RoutedTrace",
            "iter_dump",
            "process_header",
            "read_dump",
            "sniff",
            "write_dump",
        }
    )
    assert FORMAT_VERSION == 1


# --------------------------------------------------------------------------
# sniff and pickles


def test_sniff_heapwatch(tmp_path: Path) -> None:
    data = dump_bytes(SIMPLE_TRACES)
    assert sniff(data) == "heapwatch"
    assert sniff(dump_bytes(SIMPLE_TRACES, compress=True)) == "heapwatch"
    assert sniff(preamble(major=9)) == "heapwatch"  # any version
    path = tmp_path / "x"
    path.write_bytes(data)
    assert sniff(path) == "heapwatch"
    assert sniff(str(path)) == "heapwatch"


def stdlib_snapshot() -> tracemalloc.Snapshot:
    # built by hand: no tracing needed
    return tracemalloc.Snapshot([(0, 10, (("a.py", 1),), 1), (0, 20, (("b.py", 2),), 1)], 1)


def test_sniff_the_stdlib_pickle(tmp_path: Path) -> None:
    path = tmp_path / "stdlib.pickle"
    stdlib_snapshot().dump(str(path))  # the stdlib's own dump format
    assert sniff(path) == "pickle"
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert sniff(pickle.dumps(stdlib_snapshot(), protocol)) == "pickle", protocol


@pytest.mark.parametrize(
    "data",
    [b"", b"x", MAGIC[:-1], b"\x1f\x8b\x08\x00", b"\x80\x06", b"\x80", b"{}", b"hello world"],
)
def test_sniff_unknown(data: bytes) -> None:
    assert sniff(data) == "unknown"


def test_sniff_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        sniff(tmp_path / "missing")


class _Evil:
    """Unpickling this creates a marker file: proof that a pickle ran."""

    marker = ""

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def test_readers_refuse_pickles_without_running_them(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = _Evil()
    evil.marker = str(marker)
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(evil, pickle.HIGHEST_PROTOCOL))
    for reader in (read_dump, iter_dump):
        with pytest.raises(DumpError, match="pickle") as info:
            reader(path)
        assert "arbitrary code" in str(info.value)
        assert "stdlib tracemalloc" in str(info.value)
    assert not marker.exists()
    stdlib = tmp_path / "stdlib.pickle"
    stdlib_snapshot().dump(str(stdlib))
    refused(stdlib.read_bytes(), "is a pickle")


# --------------------------------------------------------------------------
# versions


def test_newer_major_version_is_refused_naming_both() -> None:
    data = assemble([header_record(), end_record(0, 0, 0)], pre=preamble(major=2, minor=3))
    error = refused(data, "upgrade heapwatch")
    assert "version 2.3" in str(error)
    assert "it writes 1.2" in str(error)


def test_major_version_zero_is_refused() -> None:
    refused(assemble([header_record(), end_record(0, 0, 0)], pre=preamble(major=0, minor=0)), "0.0")


def test_newer_minor_version_is_read() -> None:
    """A newer minor version may append header fields and add extension
    records; this reader skips both."""
    payload = header_payload() + b"\x05future"
    data = assemble(
        [
            header_record(payload),
            bytes([0x83]) + varint(3) + b"abc",
            string_record("a.py"),
            bytes([0xFE]) + varint(0),
            traceback_record([(0, 1)]),
            trace_record(0, 10),
            end_record(1, 1, 1),
        ],
        pre=preamble(minor=7),
    )
    assert load(data) == Dump(HDR, [(0, 10, (("a.py", 1),), 1)])


def test_extension_records_are_skipped_even_when_large() -> None:
    big = os.urandom(300_000)  # several read chunks
    data = assemble(
        [
            header_record(),
            bytes([0x83]) + varint(len(big)) + big,
            string_record("a.py"),
            traceback_record([(0, 1)]),
            trace_record(0, 10),
            bytes([0xFF]) + varint(len(big)) + big,
            end_record(1, 1, 1),
        ]
    )
    assert load(data).traces == [(0, 10, (("a.py", 1),), 1)]
    assert load(zlib_version(data)).traces == [(0, 10, (("a.py", 1),), 1)]


def zlib_version(raw_dump: bytes) -> bytes:
    """The same dump, compressed (the CRC covers the decompressed stream)."""
    pre = bytearray(raw_dump[:PREAMBLE_SIZE])
    pre[len(MAGIC) + 2] = 1
    body = raw_dump[PREAMBLE_SIZE:-4]
    return assemble([body], pre=bytes(pre), compress=True)


# --------------------------------------------------------------------------
# damaged and hostile files


@COMPRESS
def test_every_truncation_is_an_error(compress: bool) -> None:
    data = dump_bytes(SIMPLE_TRACES, now_header(extra={"a": "b"}), compress=compress)
    for length in range(len(data)):
        error = refused(data[:length])
        assert "truncated" in str(error) or "empty" in str(error), (length, error)


def test_truncation_messages_say_where() -> None:
    data = simple_dump()
    error = refused(data[:-6])  # inside the end record
    assert "record #8 (end)" in str(error)
    assert f"offset {len(data) - 8}:" in str(error)
    error = refused(data[: PREAMBLE_SIZE + len(header_record()) + 3])  # inside a string
    assert "record #1 (string)" in str(error)
    error = refused(assemble([header_record()])[:-4])
    assert "without its end record" in str(error)
    assert "after 1 records" in str(error)


@COMPRESS
def test_every_single_bit_flip_is_detected(compress: bool) -> None:
    data = simple_dump(compress)
    original = load(data)
    for index in range(len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[index] ^= 1 << bit
            try:
                dump = load(bytes(flipped))
            except DumpError:
                continue
            # Only deflate's final padding bits may be ignored by design.
            assert compress and dump == original, (index, bit)


def test_trailing_data_is_an_error() -> None:
    refused(simple_dump() + b"\x00", "trailing data")
    refused(simple_dump(compress=True) + b"\x00", "trailing data")
    # trailing data inside the compressed stream, after the CRC
    pre = preamble(compression=1)
    body = simple_dump()[PREAMBLE_SIZE:-4]
    crc = struct.pack("<I", zlib.crc32(pre + body))
    refused(pre + zlib.compress(body + crc + b"x"), "trailing data after the end record")


def test_checksum_mismatch() -> None:
    records = [header_record(), end_record(0, 0, 0)]
    error = refused(assemble(records, crc=0x12345678), "checksum mismatch")
    assert "0x12345678" in str(error)
    refused(assemble(records, crc=0x12345678, compress=True), "checksum mismatch")


def test_end_counts_must_match() -> None:
    records = [header_record(), string_record("a"), traceback_record([(0, 1)]), trace_record(0, 1)]
    refused(assemble([*records, end_record(1, 1, 2)]), "end record counts")
    refused(assemble([*records, end_record(2, 1, 1)]), "end record counts")
    refused(assemble([*records, end_record(1, 0, 1)]), "end record counts")
    assert load(assemble([*records, end_record(1, 1, 1)])).traces == [(0, 1, (("a", 1),), 1)]


def test_not_a_dump() -> None:
    refused(b"", "empty")
    refused(b"GIF89a....................", "not a heapwatch dump")
    refused(MAGIC[:5], "truncated")
    refused(MAGIC + b"\x01", "truncated")
    refused(gzip_of(simple_dump()), "not a heapwatch dump")


def gzip_of(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data)


def test_preamble_fields_are_checked() -> None:
    records = [header_record(), end_record(0, 0, 0)]
    refused(assemble(records, pre=preamble(compression=2)), "compression")
    refused(assemble(records, pre=preamble(reserved=1)), "reserved")


HOSTILE = [
    # (name, records after the header, expected message)
    ("string longer than 1 MiB", [bytes([0x02]) + varint(2**63)], "string length"),
    ("string longer than file", [bytes([0x02]) + varint(1 << 20)], "truncated"),
    ("invalid UTF-8", [string_record(b"\xff\xfe")], "not valid UTF-8"),
    ("zero frames", [string_record("a"), traceback_record([])], "0 frames"),
    ("65536 frames", [string_record("a"), bytes([0x03]) + varint(65536) + b"\x00"], "frames"),
    (
        "frames claimed, file ends",
        [string_record("a"), bytes([0x03]) + varint(65535) + b"\x00"],
        "truncated|undefined string",
    ),
    ("total_nframe", [string_record("a"), traceback_record([(0, 1)], 65536)], "total_nframe"),
    ("undefined string", [string_record("a"), traceback_record([(1, 1)])], "undefined string"),
    ("string id far away", [traceback_record([(2**60, 1)])], "undefined string"),
    ("lineno > 32 bits", [string_record("a"), traceback_record([(0, 2**32)])], "lineno"),
    ("undefined traceback", [trace_record(0, 1)], "undefined traceback"),
    ("undefined traceback 2-byte id", [trace_record(300, 1)], "undefined traceback"),
    ("undefined traceback domain", [trace_record(5, 1, domain=3)], "undefined traceback"),
    (
        "domain > 32 bits",
        [string_record("a"), traceback_record([(0, 1)]), trace_record(0, 1, domain=2**32)],
        "domain",
    ),
    (
        "size > 64 bits",
        [string_record("a"), traceback_record([(0, 1)]), trace_record(0, 2**64)],
        "64 bits",
    ),
    ("varint of 11 bytes", [bytes([0x04]) + b"\xff" * 11], "longer than 10 bytes"),
    ("endless varint", [bytes([0x02]) + b"\x80" * 40], "longer than 10 bytes"),
    ("second header", [header_record()], "second header"),
    ("unknown record type", [bytes([0x06])], "unknown record type 0x06"),
    ("zero byte", [b"\x00"], "unknown record type 0x00"),
    ("extension too long", [bytes([0x83]) + varint(1 << 30)], "extension record length"),
    ("extension past the end", [bytes([0x83]) + varint(1000) + b"abc"], "truncated"),
    ("billions of traces claimed", [end_record(0, 0, 5_000_000_000)], "end record counts"),
    ("huge end counts", [end_record(2**64 - 1, 2**64 - 1, 2**64 - 1)], "end record counts"),
]


@pytest.mark.parametrize(
    ("records", "match"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
@COMPRESS
def test_hostile_records(records: list[bytes], match: str, compress: bool) -> None:
    error = refused(
        assemble([header_record(), *records, end_record(0, 0, 0)], compress=compress), match
    )
    assert "offset" in str(error)


def test_hostile_record_message_names_record_and_offset() -> None:
    records = [header_record(), string_record("a"), traceback_record([(7, 1)])]
    error = refused(assemble([*records, end_record(1, 1, 0)]))
    offset = PREAMBLE_SIZE + len(records[0]) + len(records[1])
    assert f"record #2 (traceback) at offset {offset}: undefined string id 7" in str(error)
    error = refused(assemble([*records, end_record(1, 1, 0)], compress=True))
    assert "of the decompressed stream" in str(error)


def with_nextra(nextra: int) -> bytes:
    """A header payload with one extra entry but claiming nextra."""
    payload = header_payload(now_header(extra={"k": "v"}), minor=0)
    assert payload.endswith(b"\x01\x01k\x01v")
    return payload[:-5] + varint(nextra) + b"\x01k\x01v" + varint(0)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"", "run past"),
        (header_payload()[:-1], "run past"),
        (header_payload() + b"\x00", "unexpected bytes"),
        (header_payload(mode_index=2), "unknown mode"),
        (header_payload(now_header(pid=7, timestamp=float("nan"))), "timestamp"),
        (header_payload(now_header(traceback_limit=0)), "traceback_limit"),
        (header_payload(now_header(mode="sample", sample_interval=0)), "sample mode"),
        (with_nextra(2**62), "run past"),
    ],
)
def test_hostile_headers(payload: bytes, match: str) -> None:
    error = refused(assemble([header_record(payload), end_record(0, 0, 0)]), match)
    assert "record #0 (header) at offset 18" in str(error)


def test_hostile_header_lengths() -> None:
    refused(assemble([bytes([0x01]) + varint(1 << 40)]), "header length")
    refused(assemble([bytes([0x01]) + varint(16 << 20)]), "truncated")
    refused(assemble([string_record("a"), header_record()]), "first record must be the header")
    duplicated = text_pair("k", "v") * 2
    payload = header_payload(now_header(), minor=0)[:-1] + varint(2) + duplicated + varint(0)
    refused(assemble([header_record(payload), end_record(0, 0, 0)]), "appears twice")


def text_pair(key: str, value: str) -> bytes:
    return varint(len(key)) + key.encode() + varint(len(value)) + value.encode()


def test_billions_claimed_in_a_tiny_file_neither_allocate_nor_hang() -> None:
    """Counts and lengths in the file never size an allocation: a few bytes
    claiming billions of traces, a 16 MiB header, a 1 MiB string, 65535
    frames or 2**64 extra entries cost what the file holds."""
    tiny = [
        assemble([header_record(), end_record(0, 0, 5_000_000_000)]),
        assemble([header_record(), end_record(0, 0, 5_000_000_000)])[:-4],
        assemble([bytes([0x01]) + varint(16 << 20) + b"\x00" * 10]),
        assemble([header_record(), bytes([0x02]) + varint(1 << 20) + b"a" * 10]),
        assemble([header_record(), string_record("a"), bytes([0x03]) + varint(65535) + b"\x00"]),
        assemble([header_record(with_nextra(2**64 - 1))]),
        assemble([header_record(), bytes([0x80]) + varint(16 << 20)]),
    ]
    for data in tiny:
        assert len(data) < 200
        started = time.perf_counter()
        with peak_memory() as peak, pytest.raises(DumpError):
            load(data)
        assert peak[0] < 512 << 10, (data, peak[0])
        assert time.perf_counter() - started < 1


def test_max_traces() -> None:
    traces: list[RawTrace] = [(0, i, FRAMES, 1) for i in range(10_000)]
    data = dump_bytes(traces)
    assert load(data, max_traces=10_000).traces == traces
    with pytest.raises(DumpError, match="more than max_traces=9999"):
        load(data, max_traces=9999)
    with pytest.raises(DumpError, match="more than max_traces=0"):
        load(data, max_traces=0)
    with pytest.raises(ValueError, match="max_traces"):
        load(data, max_traces=-1)


def bomb(records: int) -> bytes:
    """A compressed dump of identical trace records: inflates ~1000 times."""
    body = bytearray(header_record() + string_record("a") + traceback_record([(0, 1)]))
    compressor = zlib.compressobj(9)
    pre = preamble(compression=1)
    crc = zlib.crc32(pre + body)
    out = bytearray(pre + compressor.compress(bytes(body)))
    chunk = trace_record(0, 64) * 100_000
    for _ in range(records // 100_000):
        crc = zlib.crc32(chunk, crc)
        out += compressor.compress(chunk)
    end = end_record(1, 1, records - records % 100_000)
    crc = zlib.crc32(end, crc)
    out += compressor.compress(end + struct.pack("<I", crc)) + compressor.flush()
    return bytes(out)


def test_decompression_bomb_is_refused(tmp_path: Path) -> None:
    data = bomb(4_000_000)  # 12 MB of records in ~12 KB
    assert len(data) < 40_000
    path = tmp_path / "bomb.hwdump"
    path.write_bytes(data)
    started = time.perf_counter()
    growth = rss_growth_mib(
        f"""
        try:
            dumpfile.read_dump({str(path)!r})
        except dumpfile.DumpError as exc:
            assert "max_inflate_ratio=300" in str(exc), exc
            assert "decompression bomb" in str(exc), exc
        else:
            raise AssertionError("the bomb was read")
        """
    )
    assert time.perf_counter() - started < 30
    # only the first 8 MiB are allowed (2.8 million identical traces, 8 bytes each)
    assert growth < 40, growth


def test_inflate_ratio_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dump_reader, "_INFLATE_ALLOWANCE", 1 << 16)
    data = bomb(300_000)
    refused(data, "max_inflate_ratio")
    # a caller who trusts the file reads it
    assert len(load(data, max_inflate_ratio=2000).traces) == 300_000
    with pytest.raises(ValueError, match="max_inflate_ratio"):
        load(data, max_inflate_ratio=0)


@pytest.mark.slow
def test_heapwatch_writer_output_passes_the_default_ratio() -> None:
    """Even a dump where every trace is the same, written at the default
    level, stays under the default ratio past the allowance."""
    out = io.BytesIO()
    write_dump(out, HDR, itertools.repeat((0, 64, FRAMES, 1), 3_000_000))
    assert len(out.getvalue()) < 9_000_000 / 100
    assert len(load(out.getvalue()).traces) == 3_000_000


def test_corrupt_compressed_stream() -> None:
    data = bytearray(simple_dump(compress=True))
    data[PREAMBLE_SIZE + 5] ^= 0xFF
    refused(bytes(data), "compress|checksum|truncated")
    refused(preamble(compression=1) + b"\x00" * 40, "compressed stream is corrupt")


def test_text_mode_stream_is_a_type_error(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.write_bytes(simple_dump())
    with open(path, encoding="latin-1") as fp, pytest.raises(TypeError, match="binary mode"):
        read_dump(fp)  # type: ignore[arg-type]
