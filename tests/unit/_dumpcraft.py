"""Builds heapwatch dump files byte by byte, independently of the writer, so
that tests can craft valid, hostile and future dumps (docs/design/dump-format.md)."""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterable, Sequence

from heapwatch.formats.dump import DumpHeader, RawTrace

MAGIC = b"\x89HEAPWATCH\r\n\x1a\n"
PREAMBLE_SIZE = len(MAGIC) + 4

HEADER = 0x01
STRING = 0x02
TRACEBACK = 0x03
TRACE = 0x04
TRACE_DOMAIN = 0x05
END = 0x7F
AGE = 0x80

U64_MAX = (1 << 64) - 1

HDR = DumpHeader(
    python_version="3.11.7",
    pid=4242,
    timestamp=1_700_000_000.25,
    mode="exact",
    sample_interval=0,
    traceback_limit=10,
    extra={"host": "db-1"},
)


def varint(value: int) -> bytes:
    """Unsigned LEB128, any size (also beyond 64 bits, for hostile files)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def text(value: str) -> bytes:
    data = value.encode("utf-8", "surrogatepass")
    return varint(len(data)) + data


def preamble(major: int = 1, minor: int = 2, compression: int = 0, reserved: int = 0) -> bytes:
    return MAGIC + bytes([major, minor, compression, reserved])


def header_payload(
    header: DumpHeader = HDR, mode_index: int | None = None, minor: int = 1
) -> bytes:
    """The header's fields as format 1.minor has them (1.1 added the ages)."""
    modes = ("exact", "sample")
    out = bytearray(text(header.python_version))
    out += varint(header.pid)
    out += struct.pack("<d", header.timestamp)
    out += varint(modes.index(header.mode) if mode_index is None else mode_index)
    out += varint(header.sample_interval)
    out += varint(header.traceback_limit)
    out += varint(len(header.extra))
    for key, value in header.extra.items():
        out += text(key) + text(value)
    if minor >= 1:
        clock = header.ages
        if clock is None:
            out += varint(0)
        else:
            out += varint(1) + varint(clock.epoch)
            out += struct.pack("<dd", clock.started, clock.interval)
    return bytes(out)


def header_record(payload: bytes | None = None) -> bytes:
    payload = header_payload() if payload is None else payload
    return bytes([HEADER]) + varint(len(payload)) + payload


def string_record(value: str | bytes) -> bytes:
    data = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
    return bytes([STRING]) + varint(len(data)) + data


def traceback_record(frames: Sequence[tuple[int, int]], total_nframe: int | None = None) -> bytes:
    """frames as (string id, lineno)."""
    total = len(frames) if total_nframe is None else total_nframe
    out = bytearray([TRACEBACK]) + varint(len(frames)) + varint(total)
    for string_id, lineno in frames:
        out += varint(string_id) + varint(lineno)
    return bytes(out)


def trace_record(tb_id: int, size: int, domain: int = 0) -> bytes:
    if domain:
        return bytes([TRACE_DOMAIN]) + varint(tb_id) + varint(domain) + varint(size)
    return bytes([TRACE]) + varint(tb_id) + varint(size)


def age_record(age: int) -> bytes:
    """The traces that follow are age epochs old (format 1.1)."""
    data = varint(age)
    return bytes([AGE]) + varint(len(data)) + data


def end_record(nstrings: int, ntracebacks: int, ntraces: int) -> bytes:
    return bytes([END]) + varint(nstrings) + varint(ntracebacks) + varint(ntraces)


def assemble(
    records: Iterable[bytes],
    *,
    pre: bytes | None = None,
    compress: bool = False,
    crc: int | None = None,
) -> bytes:
    """preamble + records + CRC32 (correct unless given), compressed if asked."""
    pre = preamble(compression=1 if compress else 0) if pre is None else pre
    body = b"".join(records)
    checksum = zlib.crc32(pre + body) if crc is None else crc
    body += struct.pack("<I", checksum)
    return pre + (zlib.compress(body) if compress else body)


def simple_dump(compress: bool = False) -> bytes:
    """A small valid dump: 2 strings, 2 tracebacks, 3 traces, one in a domain."""
    return assemble(
        [
            header_record(),
            string_record("a.py"),
            traceback_record([(0, 1)]),
            trace_record(0, 10),
            string_record("b.py"),
            traceback_record([(1, 2), (0, 3)], total_nframe=5),
            trace_record(1, 300, domain=7),
            trace_record(0, 20),
            end_record(2, 2, 3),
        ],
        compress=compress,
    )


SIMPLE_TRACES: list[RawTrace] = [
    (0, 10, (("a.py", 1),), 1),
    (7, 300, (("b.py", 2), ("a.py", 3)), 5),
    (0, 20, (("a.py", 1),), 1),
]


def now_header(**changes: object) -> DumpHeader:
    fields = {
        "python_version": "3.12.1",
        "pid": 1,
        "timestamp": time.time(),
        "mode": "exact",
        "sample_interval": 0,
        "traceback_limit": 5,
        "extra": {},
    }
    fields.update(changes)
    return DumpHeader(**fields)  # type: ignore[arg-type]
