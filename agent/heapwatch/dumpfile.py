"""heapwatch's dump file format: snapshots of live memory traces, safely.

A dump is a versioned, streamed binary file (docs/design/dump-format.md has
the byte layout).  Strings and tracebacks are defined once, the first time a
trace uses them, and every trace refers to its traceback by number, so a
snapshot of millions of traces over a few thousand tracebacks stays small and
is written with memory proportional to the distinct tracebacks.

Reading never unpickles, never trusts a count or a length from the file to
allocate, bounds every length, and limits decompression: a truncated,
corrupted or hostile file raises ``DumpError`` saying what is wrong and
where.  The stdlib's own dump format (a pickle of ``tracemalloc.Snapshot``) is
recognised by ``sniff()`` and refused by the readers: unpickling runs
arbitrary code, so whether to do it is the caller's decision.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO, Literal, Union

from heapwatch._errors import HeapwatchError

__all__ = [
    "FORMAT_VERSION",
    "Dump",
    "DumpError",
    "DumpHeader",
    "RawTrace",
    "iter_dump",
    "read_dump",
    "sniff",
    "write_dump",
]

#: A trace as the stdlib's tracemalloc holds it:
#: ``(domain, size, ((filename, lineno), ...), total_nframe)``, most recent frame first.
RawTrace = tuple[int, int, tuple[tuple[str, int], ...], int]

_Frames = tuple[tuple[str, int], ...]
_PathArg = Union[str, "os.PathLike[str]"]

#: The format's major version: a reader refuses files of a newer major version.
FORMAT_VERSION = 1
#: The minor version this module writes; readers accept every minor version of
#: their major version (minor versions only add what older readers may skip).
_FORMAT_MINOR = 0

# PNG-style magic: the high-bit first byte catches 7-bit transports, the name
# makes `head -c 16` readable, CR LF and LF catch newline translation, ^Z stops
# `type` on Windows.
_MAGIC = b"\x89HEAPWATCH\r\n\x1a\n"
# magic, major version, minor version, compression, reserved (0)
_PREAMBLE = struct.Struct(f"<{len(_MAGIC)}sBBBB")
_PREAMBLE_SIZE = _PREAMBLE.size

_COMPRESSION_NONE = 0
_COMPRESSION_ZLIB = 1

# Record types.  0x01-0x7F are core records that a reader must understand;
# 0x80-0xFF are length-prefixed extension records that a reader of the same
# major version skips when it does not know them.
_REC_HEADER = 0x01
_REC_STRING = 0x02
_REC_TRACEBACK = 0x03
_REC_TRACE = 0x04
_REC_TRACE_DOMAIN = 0x05
_REC_END = 0x7F
_REC_EXTENSION_MIN = 0x80
_RECORD_NAMES = {
    _REC_HEADER: "header",
    _REC_STRING: "string",
    _REC_TRACEBACK: "traceback",
    _REC_TRACE: "trace",
    _REC_TRACE_DOMAIN: "trace",
    _REC_END: "end",
}

_MODES = ("exact", "sample")

# Limits: every length read from a file is checked against one of these.
_MAX_STRING_BYTES = 1 << 20
_MAX_HEADER_BYTES = 16 << 20
_MAX_EXTENSION_BYTES = 16 << 20
_MAX_FRAMES = 0xFFFF
_MAX_TOTAL_NFRAME = 0xFFFF
_MAX_LINENO = 0xFFFFFFFF
_MAX_DOMAIN = 0xFFFFFFFF
_MAX_U64 = (1 << 64) - 1
_MAX_VARINT_BYTES = 10

# Default for max_inflate_ratio: the most decompressed bytes a compressed
# dump may hold per compressed byte read, beyond _INFLATE_ALLOWANCE.  Real
# dumps inflate 1.5 to 6 times; heapwatch's writer (level 1) stays under 250
# even when every trace is the same; deflate's own maximum is about 1032.
_DEFAULT_MAX_INFLATE_RATIO = 300.0
# Decompressed bytes always allowed whatever the ratio (about 2.8 million
# trace records): dumps that compress extremely well are not bombs.
_INFLATE_ALLOWANCE = 8 << 20

_READ_CHUNK = 1 << 16
_WRITE_CHUNK = 1 << 18
_BATCH = 4096
_TRACE_CACHE_SIZE = 1 << 17
_STREAM_TRACE_CACHE_SIZE = 1 << 10
_IDENTITY_CACHE_SIZE = 1 << 16
# Bytes kept buffered ahead of a record's start while the stream lasts: the
# largest fixed part of any record (the end record: tag, three varints and
# the CRC), so that only strings, frames and extensions need refills.
_LOOKAHEAD = 1 + 3 * _MAX_VARINT_BYTES + 4

_F64 = struct.Struct("<d")
_U32 = struct.Struct("<I")


class DumpError(HeapwatchError, ValueError):
    """A dump cannot be read (truncated, corrupted, hostile, newer, a pickle)
    or written (a header or trace out of the format's range).  The message says
    what is wrong and, when reading, where (offset and record number)."""


@dataclass(frozen=True)
class DumpHeader:
    """How a snapshot was taken: everything a dump says besides its traces."""

    python_version: str
    pid: int
    timestamp: float
    mode: str
    sample_interval: int
    traceback_limit: int
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Dump:
    """A whole dump: its header and every trace, in the order written."""

    header: DumpHeader
    traces: list[RawTrace]


# --------------------------------------------------------------------------
# varints


def _varint(value: int) -> bytes:
    """Unsigned LEB128; the caller checked 0 <= value <= 2**64 - 1."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Malformed(Exception):
    """Internal: a field is invalid; the parser adds where."""


def _varint_at(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at buf[pos] and the position after it.  Raises IndexError
    when buf ends inside it and _Malformed when it is longer than 10 bytes or
    exceeds 64 bits (so a hostile run of 0xFF bytes cannot loop)."""
    result = 0
    shift = 0
    for _ in range(_MAX_VARINT_BYTES):
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result > _MAX_U64:
                raise _Malformed("varint exceeds 64 bits")
            return result, pos
        shift += 7
    raise _Malformed(f"varint longer than {_MAX_VARINT_BYTES} bytes")


# --------------------------------------------------------------------------
# validation shared by the writer and the reader


def _header_problem(header: DumpHeader) -> str | None:
    """Why header cannot be stored, or None."""
    checks: list[tuple[bool, str]] = [
        (isinstance(header.python_version, str), "python_version must be a str"),
        (_is_int(header.pid) and 0 <= header.pid <= _MAX_U64, "pid must be an int in 0..2**64-1"),
        (
            isinstance(header.timestamp, (int, float))
            and not isinstance(header.timestamp, bool)
            and math.isfinite(header.timestamp),
            "timestamp must be a finite float",
        ),
        (header.mode in _MODES, f"mode must be 'exact' or 'sample', not {header.mode!r}"),
        (
            _is_int(header.sample_interval) and 0 <= header.sample_interval <= _MAX_U64,
            "sample_interval must be an int in 0..2**64-1",
        ),
        (
            _is_int(header.traceback_limit) and 1 <= header.traceback_limit <= _MAX_FRAMES,
            f"traceback_limit must be an int in 1..{_MAX_FRAMES}",
        ),
        (isinstance(header.extra, Mapping), "extra must be a mapping of str to str"),
    ]
    for ok, problem in checks:
        if not ok:
            return problem
    if header.mode == "exact" and header.sample_interval != 0:
        return f"sample_interval must be 0 in exact mode, not {header.sample_interval}"
    if header.mode == "sample" and header.sample_interval == 0:
        return "sample_interval must be at least 1 in sample mode"
    for key, value in header.extra.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return f"extra must map str to str; {key!r}: {value!r} does not"
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _encode_str(text: str, what: str) -> bytes:
    """UTF-8 with lone surrogates kept (surrogatepass), so that filenames
    decoded with surrogateescape round-trip exactly."""
    if not isinstance(text, str):
        raise DumpError(f"cannot write {what}: expected a str, got {type(text).__name__}")
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > _MAX_STRING_BYTES:
        raise DumpError(
            f"cannot write {what}: {len(data)} bytes of UTF-8, the format's limit is "
            f"{_MAX_STRING_BYTES}"
        )
    return data


# --------------------------------------------------------------------------
# writing


class _Sink:
    """Buffers records, checksums them, compresses them, writes them out."""

    def __init__(self, fp: BinaryIO, compress: bool, level: int) -> None:
        self._fp = fp
        self._compressor = zlib.compressobj(level) if compress else None
        preamble = _PREAMBLE.pack(
            _MAGIC,
            FORMAT_VERSION,
            _FORMAT_MINOR,
            _COMPRESSION_ZLIB if compress else _COMPRESSION_NONE,
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
        self.buf += _U32.pack(self.crc)
        data = bytes(self.buf)
        self.buf.clear()
        if self._compressor is not None:
            data = self._compressor.compress(data) + self._compressor.flush()
        self._fp.write(data)


def _header_record(header: DumpHeader) -> bytes:
    problem = _header_problem(header)
    if problem is not None:
        raise DumpError(f"cannot write the dump header: {problem}")
    payload = bytearray()

    def put_str(text: str, what: str) -> None:
        data = _encode_str(text, what)
        payload.extend(_varint(len(data)))
        payload.extend(data)

    put_str(header.python_version, "the header's python_version")
    payload += _varint(header.pid)
    payload += _F64.pack(float(header.timestamp))
    payload += _varint(_MODES.index(header.mode))
    payload += _varint(header.sample_interval)
    payload += _varint(header.traceback_limit)
    payload += _varint(len(header.extra))
    for key, value in header.extra.items():
        put_str(key, f"the header's extra key {key!r}")
        put_str(value, f"the header's extra value for {key!r}")
    if len(payload) > _MAX_HEADER_BYTES:
        raise DumpError(
            f"cannot write the dump header: {len(payload)} bytes, the format's limit is "
            f"{_MAX_HEADER_BYTES}"
        )
    return bytes([_REC_HEADER]) + _varint(len(payload)) + bytes(payload)


def write_dump(
    target: Union[_PathArg, BinaryIO],
    header: DumpHeader,
    traces: Iterable[RawTrace],
    *,
    compress: bool = True,
    compresslevel: int = 1,
) -> None:
    """Writes header and traces as a dump to target (a path, or a binary file
    open for writing, which is left open).

    Streams: traces may be any iterable (a generator of millions); memory is
    proportional to the distinct tracebacks and filenames, not to the traces.
    With compress (the default) the records are zlib-compressed at
    compresslevel (1, the fastest, suits a live service).

    Raises DumpError, before or while writing, when the header or a trace is
    outside the format's range (the message names the trace's index); a file
    written to a path is then removed rather than left half-written.
    """
    if not (_is_int(compresslevel) and -1 <= compresslevel <= 9):
        raise ValueError(f"compresslevel must be an int in -1..9, not {compresslevel!r}")
    if isinstance(target, (str, os.PathLike)):
        path = os.fspath(target)
        with open(path, "wb") as fp:
            try:
                _write(fp, header, traces, compress, compresslevel)
            except BaseException:
                fp.close()
                # a half-written dump is only ever an error for its readers
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
    else:
        _write(target, header, traces, compress, compresslevel)


def _write(
    fp: BinaryIO, header: DumpHeader, traces: Iterable[RawTrace], compress: bool, level: int
) -> None:
    header_record = _header_record(header)
    sink = _Sink(fp, compress, level)
    out = sink.buf
    out += header_record
    strings: dict[str, int] = {}
    # (frames, total_nframe) -> the traceback id's varint
    tracebacks: dict[tuple[_Frames, int], bytes] = {}
    # id(frames) -> (frames, total_nframe, trace record prefix, id varint).
    # The tracer hands out one frames tuple per traceback, so identity finds
    # it without hashing every frame of every trace; holding frames keeps its
    # id from being reused, and clearing when full bounds the cache should a
    # producer build a new tuple per trace.
    by_identity: dict[int, tuple[_Frames, int, bytes, bytes]] = {}
    ntraces = 0
    for trace in traces:
        try:
            domain, size, frames, total_nframe = trace
            hit = by_identity.get(id(frames))
            if hit is None or hit[0] is not frames or hit[1] != total_nframe:
                tb_id = tracebacks.get((frames, total_nframe))
                if tb_id is None:
                    tb_id = _define_traceback(out, strings, tracebacks, frames, total_nframe)
                if len(by_identity) >= _IDENTITY_CACHE_SIZE:
                    by_identity.clear()
                hit = by_identity[id(frames)] = (
                    frames,
                    total_nframe,
                    bytes([_REC_TRACE]) + tb_id,
                    tb_id,
                )
            if domain == 0:
                out += hit[2]
            else:
                if not (_is_int(domain) and 0 < domain <= _MAX_DOMAIN):
                    raise DumpError(f"domain {domain!r} is not an int in 0..{_MAX_DOMAIN}")
                out.append(_REC_TRACE_DOMAIN)
                out += hit[3]
                out += _varint(domain)
            # The common one- and two-byte sizes inline: this runs per trace.
            if 0 <= size < 0x80:
                out.append(size)
            elif 0x80 <= size < 0x4000:
                out.append((size & 0x7F) | 0x80)
                out.append(size >> 7)
            elif _is_int(size) and 0 <= size <= _MAX_U64:
                out += _varint(size)
            else:
                raise DumpError(f"size {size!r} is not an int in 0..2**64-1")
        except DumpError as exc:
            raise DumpError(f"cannot write trace #{ntraces} {_short(trace)}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise DumpError(
                f"cannot write trace #{ntraces} {_short(trace)}: not a "
                f"(domain, size, frames, total_nframe) trace ({exc})"
            ) from exc
        ntraces += 1
        if len(out) >= _WRITE_CHUNK:
            sink.flush()
    out.append(_REC_END)
    out += _varint(len(strings))
    out += _varint(len(tracebacks))
    out += _varint(ntraces)
    sink.finish()


def _short(trace: object) -> str:
    text = repr(trace)
    return text if len(text) <= 200 else text[:200] + "...)"


def _define_traceback(
    out: bytearray,
    strings: dict[str, int],
    tracebacks: dict[tuple[_Frames, int], bytes],
    frames: _Frames,
    total_nframe: int,
) -> bytes:
    """Appends the records defining a new traceback (and its new filenames)
    to out; returns its id's varint."""
    if not (_is_int(total_nframe) and 0 <= total_nframe <= _MAX_TOTAL_NFRAME):
        raise DumpError(f"total_nframe {total_nframe!r} is not an int in 0..{_MAX_TOTAL_NFRAME}")
    if not isinstance(frames, tuple):
        raise DumpError(f"frames must be a tuple, not {type(frames).__name__}")
    if not 1 <= len(frames) <= _MAX_FRAMES:
        raise DumpError(f"{len(frames)} frames; a traceback has 1 to {_MAX_FRAMES}")
    body = bytearray([_REC_TRACEBACK])
    body += _varint(len(frames))
    body += _varint(total_nframe)
    for frame in frames:
        if not (isinstance(frame, tuple) and len(frame) == 2):
            raise DumpError(f"frame {frame!r} is not a (filename, lineno) tuple")
        filename, lineno = frame
        if not (_is_int(lineno) and 0 <= lineno <= _MAX_LINENO):
            raise DumpError(f"frame {frame!r}: lineno is not an int in 0..{_MAX_LINENO}")
        string_id = strings.get(filename)
        if string_id is None:
            data = _encode_str(filename, f"the filename of frame {frame!r}")
            out.append(_REC_STRING)
            out += _varint(len(data))
            out += data
            string_id = strings[filename] = len(strings)
        body += _varint(string_id)
        body += _varint(lineno)
    out += body
    tb_id = tracebacks[(frames, total_nframe)] = _varint(len(tracebacks))
    return tb_id


# --------------------------------------------------------------------------
# reading: byte sources


class _Input:
    """Reads a binary file, counting bytes; closes it only if it opened it."""

    def __init__(self, source: Union[_PathArg, BinaryIO]) -> None:
        if isinstance(source, (str, os.PathLike)):
            self.name = repr(os.fspath(source))
            # Outlives this call (iter_dump's iterator reads it); close() closes it.
            self.fp: BinaryIO = open(source, "rb")  # noqa: SIM115
            self.owned = True
        else:
            name = getattr(source, "name", None)
            self.name = repr(name) if isinstance(name, str) else "<stream>"
            self.fp = source
            self.owned = False
        self.consumed = 0

    def read(self, n: int) -> bytes:
        """Up to n bytes; b"" only at the end of the file."""
        chunk = self.fp.read(n)
        if not isinstance(chunk, (bytes, bytearray)):
            raise TypeError(
                f"{self.name}: read() returned {type(chunk).__name__}; "
                "open the dump in binary mode ('rb')"
            )
        self.consumed += len(chunk)
        return bytes(chunk)

    def read_exactly(self, n: int) -> bytes:
        """n bytes, or fewer only at the end of the file."""
        parts = []
        while n > 0:
            chunk = self.read(min(n, _READ_CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def close(self) -> None:
        if self.owned:
            self.fp.close()


class _Inflater:
    """The decompressed record stream of a compressed dump, produced chunk by
    chunk with bounded output per call and a bounded expansion ratio."""

    def __init__(self, raw: _Input, max_ratio: float) -> None:
        self._raw = raw
        self._start = raw.consumed
        self._zlib = zlib.decompressobj()
        self._max_ratio = max_ratio
        self._out = 0
        self._done = False

    def read(self, n: int) -> bytes:
        """Up to n decompressed bytes; b"" only after the whole compressed
        stream was read and checked to end the file."""
        while not self._done:
            tail = self._zlib.unconsumed_tail
            data = tail if tail else self._raw.read(_READ_CHUNK)
            try:
                out = self._zlib.decompress(data, n)
            except zlib.error as exc:
                raise DumpError(
                    f"{self._raw.name}: the compressed stream is corrupt near file offset "
                    f"{self._raw.consumed}: {exc}"
                ) from None
            if tail and not out and len(self._zlib.unconsumed_tail) == len(tail):
                # zlib always progresses; this guards the loop should it not.
                raise DumpError(f"{self._raw.name}: the compressed stream makes no progress")
            if self._zlib.eof:
                self._done = True
                if self._zlib.unused_data or self._raw.read(1):
                    raise DumpError(
                        f"{self._raw.name}: trailing data after the end of the compressed "
                        f"stream (file offset {self._raw.consumed - len(self._zlib.unused_data)})"
                    )
            if out:
                self._out += len(out)
                self._check_ratio()
                return out
            if not data and not self._zlib.eof:
                raise DumpError(
                    f"{self._raw.name}: truncated: the file ends at offset "
                    f"{self._raw.consumed} inside the compressed stream"
                )
        return b""

    def _check_ratio(self) -> None:
        compressed = self._raw.consumed - self._start - len(self._zlib.unconsumed_tail)
        if self._out > _INFLATE_ALLOWANCE and self._out > self._max_ratio * max(compressed, 1):
            raise DumpError(
                f"{self._raw.name}: refusing to decompress further: {self._out} bytes from "
                f"{compressed} compressed bytes exceeds max_inflate_ratio={self._max_ratio:g} "
                "(a decompression bomb?); pass a larger max_inflate_ratio for a file you trust"
            )


def _open_stream(
    source: Union[_PathArg, BinaryIO], max_inflate_ratio: float, trace_cache_size: int
) -> tuple[_Input, _Parser]:
    if not (isinstance(max_inflate_ratio, (int, float)) and max_inflate_ratio >= 1):
        raise ValueError(f"max_inflate_ratio must be a number >= 1, not {max_inflate_ratio!r}")
    raw = _Input(source)
    try:
        preamble = raw.read_exactly(_PREAMBLE_SIZE)
        compression = _check_preamble(preamble, raw.name)
        if compression == _COMPRESSION_ZLIB:
            read = _Inflater(raw, max_inflate_ratio).read
        else:
            read = raw.read
        parser = _Parser(raw.name, read, preamble, compression != 0, trace_cache_size)
    except BaseException:
        raw.close()
        raise
    return raw, parser


def _check_preamble(preamble: bytes, name: str) -> int:
    """The compression the preamble announces; DumpError if it is not ours."""
    kind = sniff(preamble)
    if kind == "pickle":
        raise DumpError(
            f"{name} is a pickle (the stdlib tracemalloc Snapshot.dump() format), not a "
            "heapwatch dump; unpickling runs arbitrary code from the file, so the dump reader "
            "never does it: use dumpfile.sniff() and unpickle it yourself only if you trust it"
        )
    if kind != "heapwatch":
        if not preamble:
            raise DumpError(f"{name} is empty, not a heapwatch dump")
        if len(preamble) < len(_MAGIC) and _MAGIC.startswith(preamble):
            raise DumpError(f"{name}: truncated: {len(preamble)} bytes, inside the magic bytes")
        raise DumpError(
            f"{name} is not a heapwatch dump: it starts with {preamble[: len(_MAGIC)]!r}, "
            f"not the magic bytes {_MAGIC!r}"
        )
    if len(preamble) < _PREAMBLE_SIZE:
        raise DumpError(f"{name}: truncated: {len(preamble)} bytes, inside the preamble")
    _, major, minor, compression, reserved = _PREAMBLE.unpack(preamble)
    if major > FORMAT_VERSION:
        raise DumpError(
            f"{name} is in dump format version {major}.{minor}, newer than this heapwatch "
            f"reads (format {FORMAT_VERSION}.x; it writes {FORMAT_VERSION}.{_FORMAT_MINOR}): "
            "upgrade heapwatch to read it"
        )
    if major != FORMAT_VERSION:
        raise DumpError(
            f"{name} is in dump format version {major}.{minor}, which never existed; "
            f"this heapwatch reads format {FORMAT_VERSION}.x"
        )
    if compression not in (_COMPRESSION_NONE, _COMPRESSION_ZLIB) or reserved != 0:
        raise DumpError(
            f"{name}: unknown compression {compression} or reserved byte {reserved} "
            f"in the preamble (offset {len(_MAGIC) + 2})"
        )
    return int(compression)


# --------------------------------------------------------------------------
# reading: records


class _Parser:
    """Parses the record stream; owns the only buffer.

    Memory stays proportional to the bytes read: the buffer holds one chunk
    (or one record, itself bounded), and every string, frame, traceback and
    trace kept was paid for by bytes of the file.
    """

    def __init__(
        self,
        name: str,
        read: Callable[[int], bytes],
        preamble: bytes,
        compressed: bool,
        trace_cache_size: int,
    ) -> None:
        self.name = name
        self._read = read
        self._buf = b""
        self._pos = 0
        self._base = _PREAMBLE_SIZE  # stream offset of _buf[0]
        self._eof = False
        self._crc = zlib.crc32(preamble)
        self._where = " (of the decompressed stream)" if compressed else ""
        self._minor = preamble[len(_MAGIC) + 1]
        self._record_offset = 0  # stream offset of the record a helper parses
        self.nrecords = 0
        self.ntraces = 0
        self.finished = False
        self._strings: list[str] = []
        self._tracebacks: list[_Frames] = []
        self._totals: list[int] = []
        # Interned frames and domain-0 traces: a real snapshot repeats both,
        # and sharing them keeps loaded traces small.  The trace cache is
        # bounded (cleared when full) since distinct sizes are not; a
        # streaming reader keeps it small as it keeps no traces.
        self._frames: dict[tuple[int, int], tuple[str, int]] = {}
        self._trace_cache: dict[tuple[int, int], RawTrace] = {}
        self._trace_cache_size = trace_cache_size

    # -- buffer --------------------------------------------------------------

    def _refill(self, pos: int, need: int) -> int:
        """Drops the consumed bytes before pos (checksumming them) and makes
        at least need bytes available from the new position, 0 (fewer only at
        the end of the stream)."""
        buf = self._buf
        if pos:
            self._crc = zlib.crc32(memoryview(buf)[:pos], self._crc)
            self._base += pos
            buf = buf[pos:]
        parts = [buf]
        have = len(buf)
        while have < need and not self._eof:
            # Chunk by chunk, so that a record claiming megabytes in a short
            # file costs only the bytes that are there.
            chunk = self._read(_READ_CHUNK)
            if not chunk:
                self._eof = True
            have += len(chunk)
            parts.append(chunk)
        self._buf = b"".join(parts) if len(parts) > 1 else buf
        return 0

    def _error(self, problem: str, offset: int, tag: int | None) -> DumpError:
        kind = "unknown" if tag is None else _RECORD_NAMES.get(tag, "extension")
        return DumpError(
            f"{self.name}: record #{self.nrecords} ({kind}) at offset {offset}{self._where}: "
            f"{problem}"
        )

    def _truncated(self, offset: int, tag: int | None) -> DumpError:
        if tag is None:
            return DumpError(
                f"{self.name}: truncated: the dump ends at offset {offset}{self._where} "
                f"after {self.nrecords} records, without its end record"
            )
        return self._error("truncated: the dump ends inside this record", offset, tag)

    # -- records -------------------------------------------------------------

    def read_header(self) -> DumpHeader:
        """Parses the first record, which must be the header."""
        pos = self._refill(0, _LOOKAHEAD)
        buf = self._buf
        offset = self._base
        try:
            tag = buf[pos]
            if tag != _REC_HEADER:
                raise _Malformed(f"the first record must be the header (0x01), not 0x{tag:02x}")
            length, pos = _varint_at(buf, pos + 1)
            if length > _MAX_HEADER_BYTES:
                raise _Malformed(
                    f"header length {length} exceeds the format's limit of {_MAX_HEADER_BYTES}"
                )
            pos = self._refill(pos, length)
            payload = self._buf[:length]
            if len(payload) < length:
                raise IndexError
            self._pos = length
        except IndexError:
            raise self._truncated(offset, _REC_HEADER) from None
        except _Malformed as exc:
            raise self._error(str(exc), offset, _REC_HEADER) from None
        try:
            header = self._parse_header(payload)
        except _Malformed as exc:
            raise self._error(str(exc), offset, _REC_HEADER) from None
        except IndexError:
            raise self._error(
                "malformed: the header's fields run past its length", offset, _REC_HEADER
            ) from None
        self.nrecords = 1
        return header

    def _parse_header(self, payload: bytes) -> DumpHeader:
        def get_str(pos: int, what: str) -> tuple[str, int]:
            length, pos = _varint_at(payload, pos)
            if pos + length > len(payload):
                raise IndexError
            return _decode_str(payload[pos : pos + length], what), pos + length

        python_version, pos = get_str(0, "python_version")
        pid, pos = _varint_at(payload, pos)
        if pos + _F64.size > len(payload):
            raise IndexError
        (timestamp,) = _F64.unpack_from(payload, pos)
        pos += _F64.size
        mode_index, pos = _varint_at(payload, pos)
        if mode_index >= len(_MODES):
            raise _Malformed(f"unknown mode {mode_index}")
        sample_interval, pos = _varint_at(payload, pos)
        traceback_limit, pos = _varint_at(payload, pos)
        nextra, pos = _varint_at(payload, pos)
        extra: dict[str, str] = {}
        # Never more iterations than the payload has bytes: get_str consumes
        # at least one byte or raises.
        for _ in range(nextra):
            key, pos = get_str(pos, "an extra key")
            value, pos = get_str(pos, "an extra value")
            if key in extra:
                raise _Malformed(f"extra key {key!r} appears twice")
            extra[key] = value
        if pos != len(payload) and self._minor <= _FORMAT_MINOR:
            # Newer minor versions may append fields; this one has no more.
            raise _Malformed(f"{len(payload) - pos} unexpected bytes after the header's fields")
        header = DumpHeader(
            python_version=python_version,
            pid=pid,
            timestamp=timestamp,
            mode=_MODES[mode_index],
            sample_interval=sample_interval,
            traceback_limit=traceback_limit,
            extra=extra,
        )
        problem = _header_problem(header)
        if problem is not None:
            raise _Malformed(problem)
        return header

    def read_batch(self, limit: int) -> list[RawTrace]:
        """Up to limit traces (fewer only when the dump is finished); parses
        the end record and checks the dump's integrity when it reaches it."""
        out: list[RawTrace] = []
        if self.finished:
            return out
        append = out.append
        tracebacks = self._tracebacks
        totals = self._totals
        cache = self._trace_cache
        cache_get = cache.get
        cache_size = self._trace_cache_size
        rec_trace = _REC_TRACE
        lookahead = _LOOKAHEAD
        buf = self._buf
        pos = self._pos
        # Past this position fewer than lookahead bytes remain: refill.
        refill_at = self._refill_at()
        remaining = limit
        nrecords = self.nrecords  # records parsed, hence the current one's number
        start = pos
        tag: int | None = None
        try:
            while True:
                if pos > refill_at:
                    pos = self._refill(pos, lookahead)
                    buf = self._buf
                    refill_at = self._refill_at()
                start = pos
                tag = None
                tag = buf[pos]
                if tag == rec_trace:
                    # The hot path, one- and two-byte varints inline; at
                    # least _LOOKAHEAD bytes are buffered unless the stream
                    # ends (then IndexError reports the truncation).
                    tb_id = buf[pos + 1]
                    if tb_id < 0x80:
                        pos += 2
                    else:
                        byte = buf[pos + 2]
                        if byte < 0x80:
                            tb_id = (tb_id & 0x7F) | (byte << 7)
                            pos += 3
                        else:
                            tb_id, pos = _varint_at(buf, pos + 1)
                    size = buf[pos]
                    if size < 0x80:
                        pos += 1
                    else:
                        byte = buf[pos + 1]
                        if byte < 0x80:
                            size = (size & 0x7F) | (byte << 7)
                            pos += 2
                        else:
                            size, pos = _varint_at(buf, pos)
                    trace = cache_get((tb_id, size))
                    if trace is None:
                        if tb_id >= len(tracebacks):
                            raise _Malformed(f"undefined traceback id {tb_id}")
                        if len(cache) >= cache_size:
                            cache.clear()
                        trace = cache[(tb_id, size)] = (0, size, tracebacks[tb_id], totals[tb_id])
                    append(trace)
                    nrecords += 1
                    remaining -= 1
                    if not remaining:
                        break
                elif tag == _REC_TRACE_DOMAIN:
                    tb_id, pos = _varint_at(buf, pos + 1)
                    domain, pos = _varint_at(buf, pos)
                    size, pos = _varint_at(buf, pos)
                    if tb_id >= len(tracebacks):
                        raise _Malformed(f"undefined traceback id {tb_id}")
                    if domain > _MAX_DOMAIN:
                        raise _Malformed(f"domain {domain} exceeds 32 bits")
                    append((domain, size, tracebacks[tb_id], totals[tb_id]))
                    nrecords += 1
                    remaining -= 1
                    if not remaining:
                        break
                else:
                    # Rarer records may refill the buffer (dropping what
                    # precedes them), so they keep their own offset.
                    self._record_offset = self._base + start
                    if tag == _REC_STRING:
                        pos = self._read_string(pos + 1)
                    elif tag == _REC_TRACEBACK:
                        pos = self._read_traceback(pos + 1)
                    elif tag == _REC_END:
                        pos = self._read_end(pos + 1, self.ntraces + len(out))
                        nrecords += 1
                        break
                    elif tag >= _REC_EXTENSION_MIN:
                        pos = self._skip_extension(pos + 1)
                    elif tag == _REC_HEADER:
                        raise _Malformed("a second header record")
                    else:
                        raise _Malformed(f"unknown record type 0x{tag:02x}")
                    buf = self._buf
                    refill_at = self._refill_at()
                    nrecords += 1
        except IndexError:
            self.nrecords = nrecords
            raise self._truncated(self._offset_of(start, tag), tag) from None
        except _Malformed as exc:
            self.nrecords = nrecords
            raise self._error(str(exc), self._offset_of(start, tag), tag) from None
        self.nrecords = nrecords
        self._pos = pos
        self.ntraces += len(out)
        return out

    def _refill_at(self) -> int:
        if self._eof:
            return len(self._buf)  # never: IndexError reports truncations
        return len(self._buf) - _LOOKAHEAD

    def _offset_of(self, start: int, tag: int | None) -> int:
        if tag is None or tag in (_REC_TRACE, _REC_TRACE_DOMAIN):
            return self._base + start
        return self._record_offset

    def _read_string(self, pos: int) -> int:
        length, pos = _varint_at(self._buf, pos)
        if length > _MAX_STRING_BYTES:
            raise _Malformed(f"string length {length} exceeds the limit of {_MAX_STRING_BYTES}")
        if len(self._buf) - pos < length:
            pos = self._refill(pos, length)
        data = self._buf[pos : pos + length]
        if len(data) < length:
            raise IndexError
        self._strings.append(_decode_str(data, "the string"))
        return pos + length

    def _read_traceback(self, pos: int) -> int:
        buf = self._buf
        nframes, pos = _varint_at(buf, pos)
        if not 1 <= nframes <= _MAX_FRAMES:
            raise _Malformed(f"{nframes} frames; a traceback has 1 to {_MAX_FRAMES}")
        total_nframe, pos = _varint_at(buf, pos)
        if total_nframe > _MAX_TOTAL_NFRAME:
            raise _Malformed(f"total_nframe {total_nframe} exceeds {_MAX_TOTAL_NFRAME}")
        strings = self._strings
        nstrings = len(strings)
        interned = self._frames
        frames = []
        # Never more iterations than bytes read: each frame takes two or more.
        for _ in range(nframes):
            if len(buf) - pos < _LOOKAHEAD and not self._eof:
                pos = self._refill(pos, _LOOKAHEAD)
                buf = self._buf
            string_id, pos = _varint_at(buf, pos)
            lineno, pos = _varint_at(buf, pos)
            frame = interned.get((string_id, lineno))
            if frame is None:
                if string_id >= nstrings:
                    raise _Malformed(f"undefined string id {string_id}")
                if lineno > _MAX_LINENO:
                    raise _Malformed(f"lineno {lineno} exceeds 32 bits")
                frame = interned[(string_id, lineno)] = (strings[string_id], lineno)
            frames.append(frame)
        self._tracebacks.append(tuple(frames))
        self._totals.append(total_nframe)
        return pos

    def _skip_extension(self, pos: int) -> int:
        length, pos = _varint_at(self._buf, pos)
        if length > _MAX_EXTENSION_BYTES:
            raise _Malformed(
                f"extension record length {length} exceeds the limit of {_MAX_EXTENSION_BYTES}"
            )
        # Skipped chunk by chunk, never held whole.
        while length > 0:
            if len(self._buf) == pos:
                pos = self._refill(pos, 1)
                if not self._buf:
                    raise IndexError
            step = min(len(self._buf) - pos, length)
            pos += step
            length -= step
        return pos

    def _read_end(self, pos: int, ntraces: int) -> int:
        buf = self._buf
        nstrings, pos = _varint_at(buf, pos)
        ntracebacks, pos = _varint_at(buf, pos)
        ntraces_claimed, pos = _varint_at(buf, pos)
        counts = (len(self._strings), len(self._tracebacks), ntraces)
        if (nstrings, ntracebacks, ntraces_claimed) != counts:
            raise _Malformed(
                f"the end record counts {nstrings} strings, {ntracebacks} tracebacks and "
                f"{ntraces_claimed} traces, but the dump holds {counts[0]}, {counts[1]} and "
                f"{counts[2]}"
            )
        crc = zlib.crc32(memoryview(buf)[:pos], self._crc)
        if len(buf) - pos < _U32.size:
            raise IndexError
        (stored,) = _U32.unpack_from(buf, pos)
        if stored != crc:
            raise _Malformed(
                f"checksum mismatch: the dump says CRC32 0x{stored:08x}, its bytes give "
                f"0x{crc:08x} (corrupted)"
            )
        pos += _U32.size
        if len(buf) > pos or (not self._eof and self._read(1)):
            raise DumpError(
                f"{self.name}: trailing data after the end record, at offset "
                f"{self._base + pos}{self._where}"
            )
        self.finished = True
        return pos


def _decode_str(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise _Malformed(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


# --------------------------------------------------------------------------
# reading: public API


def read_dump(
    source: Union[_PathArg, BinaryIO],
    *,
    max_traces: int | None = None,
    max_inflate_ratio: float = _DEFAULT_MAX_INFLATE_RATIO,
) -> Dump:
    """The whole dump in source (a path, or a binary file open for reading,
    which is left open), checked from its magic bytes to its checksum.

    Raises DumpError when source is not a complete, intact heapwatch dump of a
    format version this module reads (a stdlib pickle included), when it holds
    more than max_traces traces, or when a compressed dump expands more than
    max_inflate_ratio times (beyond its first 8 MiB).  Memory is proportional
    to the bytes read, whatever counts or lengths the file claims.
    """
    if max_traces is not None and max_traces < 0:
        raise ValueError(f"max_traces must be >= 0 or None, not {max_traces!r}")
    raw, parser = _open_stream(source, max_inflate_ratio, _TRACE_CACHE_SIZE)
    try:
        header = parser.read_header()
        traces: list[RawTrace] = []
        while not parser.finished:
            traces += parser.read_batch(_BATCH)
            if max_traces is not None and len(traces) > max_traces:
                raise DumpError(
                    f"{parser.name} holds more than max_traces={max_traces} traces "
                    f"(stopped at record #{parser.nrecords})"
                )
    finally:
        raw.close()
    return Dump(header, traces)


class _TraceIterator(Iterator[RawTrace]):
    """Yields a dump's traces batch by batch; closes the file it opened at the
    end, on close(), or when collected."""

    def __init__(self, raw: _Input, parser: _Parser) -> None:
        self._raw: _Input | None = raw
        self._parser = parser
        self._batch: Iterator[RawTrace] = iter(())

    def __iter__(self) -> _TraceIterator:
        return self

    def __next__(self) -> RawTrace:
        while True:
            trace = next(self._batch, None)
            if trace is not None:
                return trace
            if self._raw is None or self._parser.finished:
                self.close()
                raise StopIteration
            try:
                self._batch = iter(self._parser.read_batch(_BATCH))
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Closes the dump's file (if iter_dump opened it); idempotent."""
        raw, self._raw = self._raw, None
        if raw is not None:
            raw.close()

    def __enter__(self) -> _TraceIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def iter_dump(
    source: Union[_PathArg, BinaryIO], *, max_inflate_ratio: float = _DEFAULT_MAX_INFLATE_RATIO
) -> tuple[DumpHeader, Iterator[RawTrace]]:
    """The header of the dump in source, read now, and an iterator over its
    traces, read as it advances (memory stays bounded whatever the dump's
    size).

    The header's errors are raised here; the traces' errors (truncation,
    corruption, checksum) by the iterator, possibly after it has yielded
    traces from the intact part: a consumer that must not act on a damaged
    dump should finish iterating before committing.  A file opened from a path
    is closed when the iterator is exhausted, fails, or is closed (it has a
    close() method and is a context manager).
    """
    raw, parser = _open_stream(source, max_inflate_ratio, _STREAM_TRACE_CACHE_SIZE)
    try:
        header = parser.read_header()
    except BaseException:
        raw.close()
        raise
    return header, _TraceIterator(raw, parser)


def sniff(source: Union[_PathArg, bytes]) -> Literal["heapwatch", "pickle", "unknown"]:
    """What a file holds, judged by its first bytes only: "heapwatch" (this
    format, any version), "pickle" (a pickle: the stdlib tracemalloc's
    Snapshot.dump() format), or "unknown".

    source is a path (str or os.PathLike) or the file's first bytes (bytes is
    content, never a path).  Never unpickles; raises OSError if the path cannot
    be read.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        head = bytes(source[:32])
    else:
        with open(source, "rb") as fp:
            head = fp.read(32)
    if head.startswith(_MAGIC):
        return "heapwatch"
    # Protocols 2 to 5 begin with PROTO (0x80) and the protocol number; the
    # stdlib dumps with the highest.  Protocols 0 and 1 pickle a Snapshot
    # through copyreg, which is their first opcode.
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if head.startswith(b"ccopy_reg\n_reconstructor\n"):
        return "pickle"
    return "unknown"
