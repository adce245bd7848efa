"""Routes in dumps (format 1.2, issue 26): each traceback's route and the
routes' names, written by ``write_dump(routes=...)`` and read back; older
readers skip both records, and this reader reads older dumps."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import pytest
from _dumpcraft import (
    HDR,
    assemble,
    end_record,
    header_payload,
    header_record,
    preamble,
    string_record,
    text,
    trace_record,
    traceback_record,
    varint,
)

from heapwatch.formats.dump import DumpError, read_dump, write_dump
from heapwatch.formats.dump.format import FORMAT_MINOR, PREAMBLE_SIZE

OLD_DUMP = Path(__file__).parent.parent / "data" / "dump-format-1.0.hwdump"
SHARED = (("shared.py", 9), ("app.py", 3))
BOOT = (("boot.py", 1),)
NAMES = {7: "/items/{id}", 8: "/users/<int:uid>", 9: "/never/used"}
# The same frames under two routes and under none, and another line.
ROUTED = [
    ((0, 100, SHARED, 2), 7),
    ((0, 40, SHARED, 2), 8),
    ((0, 100, SHARED, 2), 7),
    ((0, 5, SHARED, 2), 0),
    ((0, 64, BOOT, 1), 0),
    ((389_047, 4096, SHARED, 2), 8),
]


def written(items: list[tuple[tuple[int, int, tuple[tuple[str, int], ...], int], int]]) -> bytes:
    out = io.BytesIO()
    write_dump(out, HDR, items, compress=False, routes=NAMES)
    return out.getvalue()


def as_minor(data: bytes, minor: int) -> bytes:
    """The same records under an older minor version (checksum redone): what
    a reader of that version reads of them."""
    pre = bytearray(data[:PREAMBLE_SIZE])
    pre[PREAMBLE_SIZE - 3] = minor
    body = data[PREAMBLE_SIZE:-4]
    return bytes(pre) + body + struct.pack("<I", zlib.crc32(bytes(pre) + body))


def test_each_trace_keeps_its_route_and_only_used_names_are_written() -> None:
    data = written(ROUTED)
    assert data[PREAMBLE_SIZE - 3] == FORMAT_MINOR == 2
    dump = read_dump(io.BytesIO(data))
    assert dump.traces == [trace for trace, _route in ROUTED]
    assert dump.routes == [route for _trace, route in ROUTED]
    assert dump.route_names == {7: "/items/{id}", 8: "/users/<int:uid>"}
    # Compressed, the same.
    out = io.BytesIO()
    write_dump(out, HDR, ROUTED, routes=NAMES)
    assert read_dump(io.BytesIO(out.getvalue())).routes == dump.routes


def test_a_dump_without_routes_has_none() -> None:
    out = io.BytesIO()
    write_dump(out, HDR, [trace for trace, _route in ROUTED], compress=False)
    dump = read_dump(io.BytesIO(out.getvalue()))
    assert (dump.routes, dump.route_names) == (None, {})
    # Nor with routes given and every trace of route 0: no route record.
    unrouted = [(trace, 0) for trace, _route in ROUTED]
    assert read_dump(io.BytesIO(written(unrouted))).routes is None


def test_a_1_1_reader_skips_the_route_records_and_reads_every_trace() -> None:
    # As a 1.1 reader (this reader, told the file is 1.1): 0x81 and 0x82 are
    # extension records, skipped by their length.
    dump = read_dump(io.BytesIO(as_minor(written(ROUTED), 1)))
    assert dump.traces == [trace for trace, _route in ROUTED]
    assert (dump.routes, dump.route_names) == (None, {})


def test_older_dumps_are_read_without_routes() -> None:
    dump = read_dump(OLD_DUMP)
    assert dump.traces
    assert (dump.routes, dump.route_names) == (None, {})


def test_the_writer_refuses_a_route_without_a_name_or_out_of_range() -> None:
    with pytest.raises(DumpError, match=r"trace #0 .*route 5 has no name"):
        written([((0, 1, BOOT, 1), 5)])
    with pytest.raises(DumpError, match=r"route 65536 is not an int in 0..65535"):
        write_dump(io.BytesIO(), HDR, [((0, 1, BOOT, 1), 65536)], routes={65536: "/x"})


def route_record(route: int, name: str) -> bytes:
    payload = varint(route) + text(name)
    return bytes([0x81]) + varint(len(payload)) + payload


def traceback_route_record(route: int) -> bytes:
    payload = varint(route)
    return bytes([0x82]) + varint(len(payload)) + payload


def crafted(records: list[bytes]) -> bytes:
    return assemble(
        [
            header_record(header_payload(HDR, minor=1)),
            string_record("a.py"),
            *records,
            end_record(1, 1, 1),
        ],
        pre=preamble(minor=2),
    )


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        (
            [route_record(3, "/a"), traceback_route_record(3), traceback_record([(0, 1)])],
            r"record #3 \(traceback route\).*before any traceback",
        ),
        (
            [traceback_record([(0, 1)]), traceback_route_record(3)],
            r"record #3 \(traceback route\).*undefined route id 3",
        ),
        (
            [route_record(0, "/a"), traceback_record([(0, 1)])],
            r"record #2 \(route\).*route id 0 is not in 1..65535",
        ),
        (
            [route_record(3, "/a"), route_record(3, "/b"), traceback_record([(0, 1)])],
            r"record #3 \(route\).*route id 3 is named twice",
        ),
        (
            [
                route_record(3, "/a"),
                traceback_record([(0, 1)]),
                traceback_route_record(3),
                traceback_route_record(3),
            ],
            r"traceback 0 has a route already",
        ),
        (
            [bytes([0x81, 3]) + varint(3) + varint(9) + b"x", traceback_record([(0, 1)])],
            r"record #2 \(route\).*holds 3 bytes, its name says 11",
        ),
    ],
)
def test_bad_route_records_are_refused(records: list[bytes], problem: str) -> None:
    data = crafted([*records, trace_record(0, 10)])
    with pytest.raises(DumpError, match=problem) as info:
        read_dump(io.BytesIO(data))
    assert "offset" in str(info.value)


def test_routes_and_ages_together() -> None:
    from heapwatch.formats.dump import AgeClock, DumpHeader

    header = DumpHeader("3.11.7", 1, 1.0, "exact", 0, 2, ages=AgeClock(5, 0.5, 10.0))
    items = [((trace, age), route) for age, (trace, route) in enumerate(ROUTED)]
    out = io.BytesIO()
    write_dump(out, header, items, routes=NAMES)
    dump = read_dump(io.BytesIO(out.getvalue()))
    assert dump.traces == [trace for trace, _route in ROUTED]
    assert dump.ages == list(range(len(ROUTED)))
    assert dump.routes == [route for _trace, route in ROUTED]
