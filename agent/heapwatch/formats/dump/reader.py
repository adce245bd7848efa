"""Reads heapwatch's dump format (``format.py`` defines it), safely.

Reading never unpickles, never trusts a count or a length from the file to
allocate, bounds every length, and limits decompression: a truncated,
corrupted or hostile file raises ``DumpError`` saying what is wrong and
where.  The stdlib's own dump format (a pickle of ``tracemalloc.Snapshot``) is
recognised by ``sniff()`` and refused by the readers: unpickling runs
arbitrary code, so whether to do it is the caller's decision.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Literal, Union, overload

from heapwatch.formats.dump.format import (
    COMPRESSION_NONE,
    COMPRESSION_ZLIB,
    F64,
    FORMAT_MINOR,
    FORMAT_VERSION,
    MAGIC,
    MAX_DOMAIN,
    MAX_EXTENSION_BYTES,
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    MAX_LINENO,
    MAX_ROUTE,
    MAX_STRING_BYTES,
    MAX_TOTAL_NFRAME,
    MAX_U64,
    MAX_VARINT_BYTES,
    MODES,
    PREAMBLE,
    PREAMBLE_SIZE,
    REC_AGE,
    REC_END,
    REC_EXTENSION_MIN,
    REC_HEADER,
    REC_ROUTE,
    REC_STRING,
    REC_TRACE,
    REC_TRACE_DOMAIN,
    REC_TRACEBACK,
    REC_TRACEBACK_ROUTE,
    RECORD_NAMES,
    U32,
    AgeClock,
    AgedTrace,
    Dump,
    DumpError,
    DumpHeader,
    Frames,
    PathArg,
    RawTrace,
    header_problem,
)

__all__ = ["iter_dump", "read_dump", "sniff"]

# Default for max_inflate_ratio: the most decompressed bytes a compressed
# dump may hold per compressed byte read, beyond _INFLATE_ALLOWANCE.  Real
# dumps inflate 1.5 to 6 times; heapwatch's writer (level 1) stays under 250
# even when every trace is the same; deflate's own maximum is about 1032.
_DEFAULT_MAX_INFLATE_RATIO = 300.0
# Decompressed bytes always allowed whatever the ratio (about 2.8 million
# trace records): dumps that compress extremely well are not bombs.
_INFLATE_ALLOWANCE = 8 << 20

_READ_CHUNK = 1 << 16
_BATCH = 4096
_TRACE_CACHE_SIZE = 1 << 17
_STREAM_TRACE_CACHE_SIZE = 1 << 10
# Bytes kept buffered ahead of a record's start while the stream lasts: the
# largest fixed part of any record (the end record: tag, three varints and
# the CRC), so that only strings, frames and extensions need refills.
_LOOKAHEAD = 1 + 3 * MAX_VARINT_BYTES + 4


# --------------------------------------------------------------------------
# varints


class _Malformed(Exception):
    """Internal: a field is invalid; the parser adds where."""


def _varint_at(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at buf[pos] and the position after it.  Raises IndexError
    when buf ends inside it and _Malformed when it is longer than 10 bytes or
    exceeds 64 bits (so a hostile run of 0xFF bytes cannot loop)."""
    result = 0
    shift = 0
    for _ in range(MAX_VARINT_BYTES):
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result > MAX_U64:
                raise _Malformed("varint exceeds 64 bits")
            return result, pos
        shift += 7
    raise _Malformed(f"varint longer than {MAX_VARINT_BYTES} bytes")


# --------------------------------------------------------------------------
# reading: byte sources


class _Input:
    """Reads a binary file, counting bytes; closes it only if it opened it."""

    def __init__(self, source: Union[PathArg, BinaryIO]) -> None:
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
    source: Union[PathArg, BinaryIO], max_inflate_ratio: float, trace_cache_size: int
) -> tuple[_Input, _Parser]:
    if not (isinstance(max_inflate_ratio, (int, float)) and max_inflate_ratio >= 1):
        raise ValueError(f"max_inflate_ratio must be a number >= 1, not {max_inflate_ratio!r}")
    raw = _Input(source)
    try:
        preamble = raw.read_exactly(PREAMBLE_SIZE)
        compression = _check_preamble(preamble, raw.name)
        if compression == COMPRESSION_ZLIB:
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
            "never does it: use heapwatch.formats.dump.sniff() and unpickle it yourself only "
            "if you trust it"
        )
    if kind != "heapwatch":
        if not preamble:
            raise DumpError(f"{name} is empty, not a heapwatch dump")
        if len(preamble) < len(MAGIC) and MAGIC.startswith(preamble):
            raise DumpError(f"{name}: truncated: {len(preamble)} bytes, inside the magic bytes")
        raise DumpError(
            f"{name} is not a heapwatch dump: it starts with {preamble[: len(MAGIC)]!r}, "
            f"not the magic bytes {MAGIC!r}"
        )
    if len(preamble) < PREAMBLE_SIZE:
        raise DumpError(f"{name}: truncated: {len(preamble)} bytes, inside the preamble")
    _, major, minor, compression, reserved = PREAMBLE.unpack(preamble)
    if major > FORMAT_VERSION:
        raise DumpError(
            f"{name} is in dump format version {major}.{minor}, newer than this heapwatch "
            f"reads (format {FORMAT_VERSION}.x; it writes {FORMAT_VERSION}.{FORMAT_MINOR}): "
            "upgrade heapwatch to read it"
        )
    if major != FORMAT_VERSION:
        raise DumpError(
            f"{name} is in dump format version {major}.{minor}, which never existed; "
            f"this heapwatch reads format {FORMAT_VERSION}.x"
        )
    if compression not in (COMPRESSION_NONE, COMPRESSION_ZLIB) or reserved != 0:
        raise DumpError(
            f"{name}: unknown compression {compression} or reserved byte {reserved} "
            f"in the preamble (offset {len(MAGIC) + 2})"
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
        self._base = PREAMBLE_SIZE  # stream offset of _buf[0]
        self._eof = False
        self._crc = zlib.crc32(preamble)
        self._where = " (of the decompressed stream)" if compressed else ""
        self._minor = preamble[len(MAGIC) + 1]
        self.clock: AgeClock | None = None
        # The age of the traces that follow (-1: no age record yet), and the
        # ages of the last batch's traces when the dump has ages.
        self._age = -1
        self.batch_ages: list[int] | None = None
        self._record_offset = 0  # stream offset of the record a helper parses
        self.nrecords = 0
        self.ntraces = 0
        self.finished = False
        self._strings: list[str] = []
        self._tracebacks: list[Frames] = []
        self._totals: list[int] = []
        # Interned frames and domain-0 traces: a real snapshot repeats both,
        # and sharing them keeps loaded traces small.  The trace cache is
        # bounded (cleared when full) since distinct sizes are not; a
        # streaming reader keeps it small as it keeps no traces.
        self._frames: dict[tuple[int, int], tuple[str, int]] = {}
        self._trace_cache: dict[tuple[int, int], RawTrace] = {}
        self._trace_cache_size = trace_cache_size
        # Format 1.2: the routes' names, and the route of each routed
        # traceback by its frames tuple (one per traceback: a trace's frames
        # say which traceback it is, so the hot path never looks routes up).
        self.route_names: dict[int, str] = {}
        self.routes_by_frames: dict[int, int] = {}

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
        kind = "unknown" if tag is None else RECORD_NAMES.get(tag, "extension")
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
            if tag != REC_HEADER:
                raise _Malformed(f"the first record must be the header (0x01), not 0x{tag:02x}")
            length, pos = _varint_at(buf, pos + 1)
            if length > MAX_HEADER_BYTES:
                raise _Malformed(
                    f"header length {length} exceeds the format's limit of {MAX_HEADER_BYTES}"
                )
            pos = self._refill(pos, length)
            payload = self._buf[:length]
            if len(payload) < length:
                raise IndexError
            self._pos = length
        except IndexError:
            raise self._truncated(offset, REC_HEADER) from None
        except _Malformed as exc:
            raise self._error(str(exc), offset, REC_HEADER) from None
        try:
            header = self._parse_header(payload)
        except _Malformed as exc:
            raise self._error(str(exc), offset, REC_HEADER) from None
        except IndexError:
            raise self._error(
                "malformed: the header's fields run past its length", offset, REC_HEADER
            ) from None
        self.nrecords = 1
        self.clock = header.ages
        return header

    def _parse_header(self, payload: bytes) -> DumpHeader:
        def get_str(pos: int, what: str) -> tuple[str, int]:
            length, pos = _varint_at(payload, pos)
            if pos + length > len(payload):
                raise IndexError
            return _decode_str(payload[pos : pos + length], what), pos + length

        python_version, pos = get_str(0, "python_version")
        pid, pos = _varint_at(payload, pos)
        if pos + F64.size > len(payload):
            raise IndexError
        (timestamp,) = F64.unpack_from(payload, pos)
        pos += F64.size
        mode_index, pos = _varint_at(payload, pos)
        if mode_index >= len(MODES):
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
        ages = None
        if self._minor >= 1:
            ages, pos = self._parse_clock(payload, pos)
        if pos != len(payload) and self._minor <= FORMAT_MINOR:
            # Newer minor versions may append fields; this one has no more.
            raise _Malformed(f"{len(payload) - pos} unexpected bytes after the header's fields")
        header = DumpHeader(
            python_version=python_version,
            pid=pid,
            timestamp=timestamp,
            mode=MODES[mode_index],
            sample_interval=sample_interval,
            traceback_limit=traceback_limit,
            extra=extra,
            ages=ages,
        )
        problem = header_problem(header)
        if problem is not None:
            raise _Malformed(problem)
        return header

    @staticmethod
    def _parse_clock(payload: bytes, pos: int) -> tuple[AgeClock | None, int]:
        """The header's ages (format 1.1 on): a flag, then the clock."""
        flag, pos = _varint_at(payload, pos)
        if flag == 0:
            return None, pos
        if flag != 1:
            raise _Malformed(f"the ages flag is {flag}; 0 (no ages) or 1 (ages) is allowed")
        epoch, pos = _varint_at(payload, pos)
        if pos + 2 * F64.size > len(payload):
            raise IndexError
        (started,) = F64.unpack_from(payload, pos)
        (interval,) = F64.unpack_from(payload, pos + F64.size)
        return AgeClock(epoch, started, interval), pos + 2 * F64.size

    def read_batch(self, limit: int) -> list[RawTrace]:
        """Up to limit traces (fewer only when the dump is finished); parses
        the end record and checks the dump's integrity when it reaches it.
        When the dump has ages, ``batch_ages`` then holds the traces' ages."""
        out: list[RawTrace] = []
        if self.finished:
            return out
        append = out.append
        ages: list[int] | None = [] if self.clock is not None else None
        self.batch_ages = ages
        age = self._age
        tracebacks = self._tracebacks
        totals = self._totals
        cache = self._trace_cache
        cache_get = cache.get
        cache_size = self._trace_cache_size
        rec_trace = REC_TRACE
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
                    if ages is not None:
                        if age < 0:
                            raise _Malformed("a trace before any age record (the dump has ages)")
                        ages.append(age)
                    nrecords += 1
                    remaining -= 1
                    if not remaining:
                        break
                elif tag == REC_TRACE_DOMAIN:
                    tb_id, pos = _varint_at(buf, pos + 1)
                    domain, pos = _varint_at(buf, pos)
                    size, pos = _varint_at(buf, pos)
                    if tb_id >= len(tracebacks):
                        raise _Malformed(f"undefined traceback id {tb_id}")
                    if domain > MAX_DOMAIN:
                        raise _Malformed(f"domain {domain} exceeds 32 bits")
                    append((domain, size, tracebacks[tb_id], totals[tb_id]))
                    if ages is not None:
                        if age < 0:
                            raise _Malformed("a trace before any age record (the dump has ages)")
                        ages.append(age)
                    nrecords += 1
                    remaining -= 1
                    if not remaining:
                        break
                else:
                    # Rarer records may refill the buffer (dropping what
                    # precedes them), so they keep their own offset.
                    self._record_offset = self._base + start
                    if tag == REC_STRING:
                        pos = self._read_string(pos + 1)
                    elif tag == REC_TRACEBACK:
                        pos = self._read_traceback(pos + 1)
                    elif tag == REC_END:
                        pos = self._read_end(pos + 1, self.ntraces + len(out))
                        nrecords += 1
                        break
                    elif tag == REC_AGE and self._minor >= 1:
                        pos = self._read_age(pos + 1)
                        age = self._age
                    elif tag == REC_ROUTE and self._minor >= 2:
                        pos = self._read_route(pos + 1)
                    elif tag == REC_TRACEBACK_ROUTE and self._minor >= 2:
                        pos = self._read_traceback_route(pos + 1)
                    elif tag >= REC_EXTENSION_MIN:
                        pos = self._skip_extension(pos + 1)
                    elif tag == REC_HEADER:
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
        if tag is None or tag in (REC_TRACE, REC_TRACE_DOMAIN):
            return self._base + start
        return self._record_offset

    def _read_string(self, pos: int) -> int:
        length, pos = _varint_at(self._buf, pos)
        if length > MAX_STRING_BYTES:
            raise _Malformed(f"string length {length} exceeds the limit of {MAX_STRING_BYTES}")
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
        if not 1 <= nframes <= MAX_FRAMES:
            raise _Malformed(f"{nframes} frames; a traceback has 1 to {MAX_FRAMES}")
        total_nframe, pos = _varint_at(buf, pos)
        if total_nframe > MAX_TOTAL_NFRAME:
            raise _Malformed(f"total_nframe {total_nframe} exceeds {MAX_TOTAL_NFRAME}")
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
                if lineno > MAX_LINENO:
                    raise _Malformed(f"lineno {lineno} exceeds 32 bits")
                frame = interned[(string_id, lineno)] = (strings[string_id], lineno)
            frames.append(frame)
        self._tracebacks.append(tuple(frames))
        self._totals.append(total_nframe)
        return pos

    def _read_age(self, pos: int) -> int:
        length, pos = _varint_at(self._buf, pos)
        if not 1 <= length <= MAX_VARINT_BYTES:
            raise _Malformed(
                f"age record length {length}: an age is one varint, 1 to {MAX_VARINT_BYTES} bytes"
            )
        if len(self._buf) - pos < length:
            pos = self._refill(pos, length)
        if len(self._buf) - pos < length:
            raise IndexError
        age, end = _varint_at(self._buf, pos)
        if end != pos + length:
            raise _Malformed(f"the age record says {length} bytes, its varint takes {end - pos}")
        clock = self.clock
        if clock is None:
            raise _Malformed("an age record, but the header says the traces carry no ages")
        if age > clock.epoch:
            raise _Malformed(f"age {age} exceeds the dump's epoch {clock.epoch}")
        self._age = age
        return end

    def _payload(self, pos: int, what: str) -> tuple[bytes, int]:
        """The payload of a short extension record (a varint length, then
        that many bytes, at most MAX_STRING_BYTES and a varint more), and
        the position after it."""
        length, pos = _varint_at(self._buf, pos)
        if length > MAX_STRING_BYTES + MAX_VARINT_BYTES * 2:
            raise _Malformed(f"{what} record length {length} exceeds the limit")
        if len(self._buf) - pos < length:
            pos = self._refill(pos, length)
        if len(self._buf) - pos < length:
            raise IndexError
        return self._buf[pos : pos + length], pos + length

    def _read_route(self, pos: int) -> int:
        payload, end = self._payload(pos, "route")
        try:
            route, at = _varint_at(payload, 0)
            length, at = _varint_at(payload, at)
        except IndexError:
            raise _Malformed("the route record ends inside its varints") from None
        if not 1 <= route <= MAX_ROUTE:
            raise _Malformed(f"route id {route} is not in 1..{MAX_ROUTE}")
        if route in self.route_names:
            raise _Malformed(f"route id {route} is named twice")
        if at + length != len(payload):
            raise _Malformed(
                f"the route record holds {len(payload)} bytes, its name says {at + length}"
            )
        self.route_names[route] = _decode_str(payload[at:], "a route's name")
        return end

    def _read_traceback_route(self, pos: int) -> int:
        payload, end = self._payload(pos, "traceback route")
        try:
            route, at = _varint_at(payload, 0)
        except IndexError:
            raise _Malformed("the traceback route record ends inside its varint") from None
        if at != len(payload):
            raise _Malformed(f"the traceback route record holds {len(payload)} bytes, not {at}")
        if route not in self.route_names:
            raise _Malformed(f"undefined route id {route}")
        if not self._tracebacks:
            raise _Malformed("a traceback route before any traceback")
        frames = self._tracebacks[-1]
        if id(frames) in self.routes_by_frames:
            raise _Malformed(f"traceback {len(self._tracebacks) - 1} has a route already")
        self.routes_by_frames[id(frames)] = route
        return end

    def _skip_extension(self, pos: int) -> int:
        length, pos = _varint_at(self._buf, pos)
        if length > MAX_EXTENSION_BYTES:
            raise _Malformed(
                f"extension record length {length} exceeds the limit of {MAX_EXTENSION_BYTES}"
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
        if len(buf) - pos < U32.size:
            raise IndexError
        (stored,) = U32.unpack_from(buf, pos)
        if stored != crc:
            raise _Malformed(
                f"checksum mismatch: the dump says CRC32 0x{stored:08x}, its bytes give "
                f"0x{crc:08x} (corrupted)"
            )
        pos += U32.size
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
    source: Union[PathArg, BinaryIO],
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
        ages: list[int] | None = None if header.ages is None else []
        while not parser.finished:
            traces += parser.read_batch(_BATCH)
            if ages is not None and parser.batch_ages is not None:
                ages += parser.batch_ages
            if max_traces is not None and len(traces) > max_traces:
                raise DumpError(
                    f"{parser.name} holds more than max_traces={max_traces} traces "
                    f"(stopped at record #{parser.nrecords})"
                )
    finally:
        raw.close()
    by_frames = parser.routes_by_frames
    routes = None
    if parser.route_names:
        routes = [by_frames.get(id(trace[2]), 0) for trace in traces]
    return Dump(header, traces, ages, routes, parser.route_names)


class _TraceIterator(Iterator[Any]):
    """Yields a dump's traces (with ``with_ages``, (trace, age) pairs) batch
    by batch; closes the file it opened at the end, on close(), or when
    collected."""

    def __init__(self, raw: _Input, parser: _Parser, with_ages: bool) -> None:
        self._raw: _Input | None = raw
        self._parser = parser
        self._with_ages = with_ages
        self._batch: Iterator[Any] = iter(())

    def __iter__(self) -> _TraceIterator:
        return self

    def _next_batch(self) -> Iterator[Any]:
        traces = self._parser.read_batch(_BATCH)
        if not self._with_ages:
            return iter(traces)
        ages = self._parser.batch_ages
        if ages is None:
            return ((trace, None) for trace in traces)
        return zip(traces, ages)

    def __next__(self) -> Any:
        while True:
            trace = next(self._batch, None)
            if trace is not None:
                return trace
            if self._raw is None or self._parser.finished:
                self.close()
                raise StopIteration
            try:
                self._batch = self._next_batch()
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


@overload
def iter_dump(
    source: Union[PathArg, BinaryIO],
    *,
    max_inflate_ratio: float = ...,
    ages: Literal[False] = False,
) -> tuple[DumpHeader, Iterator[RawTrace]]: ...


@overload
def iter_dump(
    source: Union[PathArg, BinaryIO], *, max_inflate_ratio: float = ..., ages: Literal[True]
) -> tuple[DumpHeader, Iterator[AgedTrace]]: ...


def iter_dump(
    source: Union[PathArg, BinaryIO],
    *,
    max_inflate_ratio: float = _DEFAULT_MAX_INFLATE_RATIO,
    ages: bool = False,
) -> tuple[DumpHeader, Iterator[Any]]:
    """The header of the dump in source, read now, and an iterator over its
    traces, read as it advances (memory stays bounded whatever the dump's
    size).  With ``ages``, the iterator yields (trace, age) pairs: age in
    epochs, None when the dump carries no ages (``header.ages`` is None).

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
    return header, _TraceIterator(raw, parser, ages)


def sniff(source: Union[PathArg, bytes]) -> Literal["heapwatch", "pickle", "unknown"]:
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
    if head.startswith(MAGIC):
        return "heapwatch"
    # Protocols 2 to 5 begin with PROTO (0x80) and the protocol number; the
    # stdlib dumps with the highest.  Protocols 0 and 1 pickle a Snapshot
    # through copyreg, which is their first opcode.
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if head.startswith(b"ccopy_reg\n_reconstructor\n"):
        return "pickle"
    return "unknown"
