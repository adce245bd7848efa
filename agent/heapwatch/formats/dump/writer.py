"""Writes heapwatch's dump format (``format.py`` defines it).

Strings and tracebacks are defined once, the first time a trace uses them,
so the writer's memory grows with the distinct tracebacks, not the traces.
``process_header`` is the one place a header for "this process, now" is built.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, BinaryIO, Union

from heapwatch.formats.dump.format import (
    COMPRESSION_NONE,
    COMPRESSION_ZLIB,
    F64,
    FORMAT_MINOR,
    FORMAT_VERSION,
    MAGIC,
    MAX_DOMAIN,
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    MAX_LINENO,
    MAX_ROUTE,
    MAX_TOTAL_NFRAME,
    MAX_U64,
    MODES,
    PREAMBLE,
    REC_AGE,
    REC_END,
    REC_HEADER,
    REC_ROUTE,
    REC_STRING,
    REC_TRACE,
    REC_TRACE_DOMAIN,
    REC_TRACEBACK,
    REC_TRACEBACK_ROUTE,
    U32,
    AgeClock,
    AgedTrace,
    DumpError,
    DumpHeader,
    Frames,
    PathArg,
    RawTrace,
    RoutedTrace,
    encode_str,
    header_problem,
    is_int,
)
from heapwatch.formats.varint import encode_varint

__all__ = ["process_header", "write_dump"]

_WRITE_CHUNK = 1 << 18
_IDENTITY_CACHE_SIZE = 1 << 16

# --------------------------------------------------------------------------
# writing


class _Sink:
    """Buffers records, checksums them, compresses them, writes them out."""

    def __init__(self, fp: BinaryIO, compress: bool, level: int) -> None:
        self._fp = fp
        self._compressor = zlib.compressobj(level) if compress else None
        preamble = PREAMBLE.pack(
            MAGIC,
            FORMAT_VERSION,
            FORMAT_MINOR,
            COMPRESSION_ZLIB if compress else COMPRESSION_NONE,
            0,
        )
        fp.write(preamble)
        self.crc = zlib.crc32(preamble)
        self.buf = bytearray()

    def flush(self) -> None:
        data = bytes(self.buf)
        self.buf.clear()
        self.crc = zlib.crc32(data, self.crc)
        if self._compressor is not None:
            data = self._compressor.compress(data)
        if data:
            self._fp.write(data)

    def finish(self) -> None:
        """Writes the CRC of everything so far, then ends the stream."""
        self.flush()
        self.buf += U32.pack(self.crc)
        data = bytes(self.buf)
        self.buf.clear()
        if self._compressor is not None:
            data = self._compressor.compress(data) + self._compressor.flush()
        self._fp.write(data)


def _header_record(header: DumpHeader) -> bytes:
    problem = header_problem(header)
    if problem is not None:
        raise DumpError(f"cannot write the dump header: {problem}")
    payload = bytearray()

    def put_str(text: str, what: str) -> None:
        data = encode_str(text, what)
        payload.extend(encode_varint(len(data)))
        payload.extend(data)

    put_str(header.python_version, "the header's python_version")
    payload += encode_varint(header.pid)
    payload += F64.pack(float(header.timestamp))
    payload += encode_varint(MODES.index(header.mode))
    payload += encode_varint(header.sample_interval)
    payload += encode_varint(header.traceback_limit)
    payload += encode_varint(len(header.extra))
    for key, value in header.extra.items():
        put_str(key, f"the header's extra key {key!r}")
        put_str(value, f"the header's extra value for {key!r}")
    clock = header.ages
    if clock is None:
        payload += encode_varint(0)
    else:
        payload += encode_varint(1)
        payload += encode_varint(clock.epoch)
        payload += F64.pack(float(clock.started))
        payload += F64.pack(float(clock.interval))
    if len(payload) > MAX_HEADER_BYTES:
        raise DumpError(
            f"cannot write the dump header: {len(payload)} bytes, the format's limit is "
            f"{MAX_HEADER_BYTES}"
        )
    return bytes([REC_HEADER]) + encode_varint(len(payload)) + bytes(payload)


def write_dump(
    target: Union[PathArg, BinaryIO],
    header: DumpHeader,
    traces: Union[Iterable[RawTrace], Iterable[AgedTrace], Iterable[RoutedTrace]],
    *,
    compress: bool = True,
    compresslevel: int = 1,
    routes: Mapping[int, str] | None = None,
) -> None:
    """Writes header and traces as a dump to target (a path, or a binary file
    open for writing, which is left open).

    With ``header.ages`` set, each trace is a ``(trace, age)`` pair, age
    the epochs since it was recorded (0 to ``header.ages.epoch``); else a
    plain trace.  With ``routes`` (route id -> name), each item is that
    paired with its route id (0: no route, else a key of ``routes``): the
    same frames under two routes are two tracebacks (format 1.2).

    Streams: traces may be any iterable (a generator of millions); memory is
    proportional to the distinct tracebacks and filenames, not to the traces.
    With compress (the default) the records are zlib-compressed at
    compresslevel (1, the fastest, suits a live service).

    Raises DumpError, before or while writing, when the header or a trace is
    outside the format's range (the message names the trace's index); a file
    written to a path is then removed rather than left half-written.
    """
    if not (is_int(compresslevel) and -1 <= compresslevel <= 9):
        raise ValueError(f"compresslevel must be an int in -1..9, not {compresslevel!r}")
    if isinstance(target, (str, os.PathLike)):
        path = os.fspath(target)
        with open(path, "wb") as fp:
            try:
                _write(fp, header, traces, compress, compresslevel, routes=routes)
            except BaseException:
                fp.close()
                # a half-written dump is only ever an error for its readers
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
    else:
        _write(target, header, traces, compress, compresslevel, routes=routes)


def _write(
    fp: BinaryIO,
    header: DumpHeader,
    traces: Union[Iterable[RawTrace], Iterable[AgedTrace], Iterable[RoutedTrace]],
    compress: bool,
    level: int,
    *,
    routes: Mapping[int, str] | None = None,
) -> None:
    header_record = _header_record(header)
    sink = _Sink(fp, compress, level)
    out = sink.buf
    out += header_record
    strings: dict[str, int] = {}
    # (frames, total_nframe, route) -> the traceback id's varint
    tracebacks: dict[tuple[Frames, int, int], bytes] = {}
    named: set[int] = set()  # the routes whose names were written
    route = 0
    # id(frames) -> (frames, total_nframe, trace record prefix, id varint).
    # The tracer hands out one frames tuple per traceback, so identity finds
    # it without hashing every frame of every trace; holding frames keeps its
    # id from being reused, and clearing when full bounds the cache should a
    # producer build a new tuple per trace.
    by_identity: dict[tuple[int, int], tuple[Frames, int, bytes, bytes]] = {}
    ntraces = 0
    max_age = -1 if header.ages is None else header.ages.epoch
    last_age: object = None
    # Any, not object: unpacked as it comes, with no cast() call per trace
    # (two calls a trace were a tenth of a million-trace black box).
    item: Any
    for item in traces:
        trace = item
        try:
            if routes is not None:
                trace, route = trace
            if max_age >= 0:
                trace, age = trace
                if age != last_age:
                    # A trace is no older than the epochs before the dump's.
                    if not (type(age) is int and 0 <= age <= max_age):
                        raise DumpError(f"age {age!r} is not an int in 0..{max_age} (the epoch)")
                    age_data = encode_varint(age)
                    out.append(REC_AGE)
                    out += encode_varint(len(age_data))
                    out += age_data
                    last_age = age
            domain, size, frames, total_nframe = trace
            hit = by_identity.get((id(frames), route))
            if hit is None or hit[0] is not frames or hit[1] != total_nframe:
                tb_id = tracebacks.get((frames, total_nframe, route))
                if tb_id is None:
                    tb_id = _define_traceback(
                        out, strings, tracebacks, frames, total_nframe, route=route
                    )
                    if route:
                        _route_traceback(out, route, routes or {}, named)
                if len(by_identity) >= _IDENTITY_CACHE_SIZE:
                    by_identity.clear()
                hit = by_identity[(id(frames), route)] = (
                    frames,
                    total_nframe,
                    bytes([REC_TRACE]) + tb_id,
                    tb_id,
                )
            if domain == 0:
                out += hit[2]
            else:
                if not (is_int(domain) and 0 < domain <= MAX_DOMAIN):
                    raise DumpError(f"domain {domain!r} is not an int in 0..{MAX_DOMAIN}")
                out.append(REC_TRACE_DOMAIN)
                out += hit[3]
                out += encode_varint(domain)
            # The common one- and two-byte sizes inline: this runs per trace.
            if 0 <= size < 0x80:
                out.append(size)
            elif 0x80 <= size < 0x4000:
                out.append((size & 0x7F) | 0x80)
                out.append(size >> 7)
            elif is_int(size) and 0 <= size <= MAX_U64:
                out += encode_varint(size)
            else:
                raise DumpError(f"size {size!r} is not an int in 0..2**64-1")
        except DumpError as exc:
            raise DumpError(f"cannot write trace #{ntraces} {_short(item)}: {exc}") from None
        except (TypeError, ValueError) as exc:
            shape = "(domain, size, frames, total_nframe)"
            if max_age >= 0:
                shape = f"({shape}, age)"
            if routes is not None:
                shape = f"({shape}, route)"
            raise DumpError(
                f"cannot write trace #{ntraces} {_short(item)}: not a {shape} trace ({exc})"
            ) from exc
        ntraces += 1
        if len(out) >= _WRITE_CHUNK:
            sink.flush()
    out.append(REC_END)
    out += encode_varint(len(strings))
    out += encode_varint(len(tracebacks))
    out += encode_varint(ntraces)
    sink.finish()


def _short(trace: object) -> str:
    text = repr(trace)
    return text if len(text) <= 200 else text[:200] + "...)"


def _route_traceback(
    out: bytearray, route: object, routes: Mapping[int, str], named: set[int]
) -> None:
    """Appends the records saying that the traceback just defined was
    allocated for ``route`` (its name first, the first time)."""
    if not (isinstance(route, int) and not isinstance(route, bool) and 0 < route <= MAX_ROUTE):
        raise DumpError(f"route {route!r} is not an int in 0..{MAX_ROUTE}")
    data = encode_varint(route)
    if route not in named:
        name = routes.get(route)
        if name is None:
            raise DumpError(f"route {route} has no name in the routes given")
        encoded = encode_str(name, "a route's name")
        payload = data + encode_varint(len(encoded)) + encoded
        out.append(REC_ROUTE)
        out += encode_varint(len(payload))
        out += payload
        named.add(route)
    out.append(REC_TRACEBACK_ROUTE)
    out += encode_varint(len(data))
    out += data


def _define_traceback(
    out: bytearray,
    strings: dict[str, int],
    tracebacks: dict[tuple[Frames, int, int], bytes],
    frames: Frames,
    total_nframe: int,
    *,
    route: int = 0,
) -> bytes:
    """Appends the records defining a new traceback (and its new filenames)
    to out; returns its id's varint."""
    if not (is_int(total_nframe) and 0 <= total_nframe <= MAX_TOTAL_NFRAME):
        raise DumpError(f"total_nframe {total_nframe!r} is not an int in 0..{MAX_TOTAL_NFRAME}")
    if not isinstance(frames, tuple):
        raise DumpError(f"frames must be a tuple, not {type(frames).__name__}")
    if not 1 <= len(frames) <= MAX_FRAMES:
        raise DumpError(f"{len(frames)} frames; a traceback has 1 to {MAX_FRAMES}")
    body = bytearray([REC_TRACEBACK])
    body += encode_varint(len(frames))
    body += encode_varint(total_nframe)
    for frame in frames:
        if not (isinstance(frame, tuple) and len(frame) == 2):
            raise DumpError(f"frame {frame!r} is not a (filename, lineno) tuple")
        filename, lineno = frame
        if not (is_int(lineno) and 0 <= lineno <= MAX_LINENO):
            raise DumpError(f"frame {frame!r}: lineno is not an int in 0..{MAX_LINENO}")
        string_id = strings.get(filename)
        if string_id is None:
            data = encode_str(filename, f"the filename of frame {frame!r}")
            out.append(REC_STRING)
            out += encode_varint(len(data))
            out += data
            string_id = strings[filename] = len(strings)
        body += encode_varint(string_id)
        body += encode_varint(lineno)
    out += body
    tb_id = tracebacks[(frames, total_nframe, route)] = encode_varint(len(tracebacks))
    return tb_id


def process_header(
    *,
    mode: str,
    sample_interval: int,
    traceback_limit: int,
    extra: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    ages: AgeClock | None = None,
) -> DumpHeader:
    """The header of a snapshot of this process taken now: its Python
    version, pid and the time, with the snapshot's own figures (``ages``
    when its traces carry them)."""
    return DumpHeader(
        python_version=sys.version.split()[0],  # as platform.python_version()
        pid=os.getpid(),
        timestamp=clock(),
        mode=mode,
        sample_interval=sample_interval,
        traceback_limit=traceback_limit,
        extra={} if extra is None else dict(extra),
        ages=ages,
    )
