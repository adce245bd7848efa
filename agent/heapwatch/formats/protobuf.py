"""A minimal protocol-buffers wire-format writer and reader.

Just enough of https://protobuf.dev/programming-guides/encoding/ to write and
read pprof's ``profile.proto``: varints (wire type 0), length-delimited fields
(wire type 2: bytes, strings, embedded messages, packed repeated scalars) and,
when reading only, the fixed-width wire types 1 and 5 so that fields written
by other encoders can be skipped.

heapwatch runs inside the monitored service, so it must not pull in a protobuf
runtime (and its version conflicts) just to export a profile.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Union

from heapwatch.formats.varint import UINT64_MAX, encode_varint

__all__ = [
    "UINT64_MAX",
    "WIRE_FIXED32",
    "WIRE_FIXED64",
    "WIRE_LEN",
    "WIRE_VARINT",
    "ProtoWriter",
    "encode_varint",
    "iter_fields",
    "to_int64",
    "unpack_varints",
]

WIRE_VARINT = 0
WIRE_FIXED64 = 1
WIRE_LEN = 2
WIRE_FIXED32 = 5

FieldValue = Union[int, bytes]


def _tag(field: int, wire_type: int) -> bytes:
    return encode_varint((field << 3) | wire_type)


class ProtoWriter:
    """Appends fields of one message to a buffer.

    Singular scalar fields follow proto3: a zero (or ``False``) is the default
    and is not written, since readers treat an absent field as zero anyway.
    Repeated and length-delimited fields are always written, because an empty
    element of a repeated field (like ``string_table[0] == ""``) still counts.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def int_field(self, field: int, value: int) -> None:
        """Write an int64/uint64 field, unless it is zero."""
        if value:
            self._buf += _tag(field, WIRE_VARINT)
            self._buf += encode_varint(value)

    def fixed64_field(self, field: int, value: int) -> None:
        """Write a fixed64 field (little-endian), unless it is zero."""
        if value:
            self._buf += _tag(field, WIRE_FIXED64)
            self._buf += value.to_bytes(8, "little")

    def bool_field(self, field: int, value: bool) -> None:
        """Write a bool field, unless it is false."""
        if value:
            self._buf += _tag(field, WIRE_VARINT)
            self._buf += b"\x01"

    def bytes_field(self, field: int, data: bytes) -> None:
        """Write a length-delimited field (bytes, an encoded string or message)."""
        self._buf += _tag(field, WIRE_LEN)
        self._buf += encode_varint(len(data))
        self._buf += data

    def message_field(self, field: int, message: ProtoWriter) -> None:
        """Write an embedded message, even an empty one."""
        self.bytes_field(field, message.getvalue())

    def packed_field(self, field: int, values: Iterable[int]) -> None:
        """Write a packed repeated varint field, unless there are no values."""
        payload = b"".join(map(encode_varint, values))
        if payload:
            self.bytes_field(field, payload)

    def extend(self, encoded: bytes) -> None:
        """Append fields that were already encoded (e.g. a cached message field)."""
        self._buf += encoded

    def __len__(self) -> int:
        return len(self._buf)

    def getvalue(self) -> bytes:
        """The message's encoded bytes so far."""
        return bytes(self._buf)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than ten bytes")
    if result > UINT64_MAX:
        raise ValueError("varint overflows a uint64")
    return result, pos


def iter_fields(data: bytes) -> Iterator[tuple[int, int, FieldValue]]:
    """Yield ``(field number, wire type, value)`` for each field of a message.

    A varint or fixed-width value is an unsigned ``int``; a length-delimited
    value is its ``bytes``. Raises ``ValueError`` on malformed input (truncated
    data, field number 0, or the deprecated group wire types).
    """
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = _read_varint(data, pos)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise ValueError("field number 0 is invalid")
        value: FieldValue
        if wire_type == WIRE_VARINT:
            value, pos = _read_varint(data, pos)
        elif wire_type == WIRE_LEN:
            length, pos = _read_varint(data, pos)
            if pos + length > end:
                raise ValueError(f"truncated length-delimited field {field}")
            value = data[pos : pos + length]
            pos += length
        elif wire_type in (WIRE_FIXED64, WIRE_FIXED32):
            width = 8 if wire_type == WIRE_FIXED64 else 4
            if pos + width > end:
                raise ValueError(f"truncated fixed-width field {field}")
            value = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        else:
            raise ValueError(f"unsupported wire type {wire_type} for field {field}")
        yield field, wire_type, value


def unpack_varints(data: bytes) -> list[int]:
    """The unsigned values of a packed repeated varint field's payload."""
    values = []
    pos = 0
    while pos < len(data):
        value, pos = _read_varint(data, pos)
        values.append(value)
    return values


def to_int64(value: int) -> int:
    """Reinterpret a decoded uint64 varint as the int64 it encodes."""
    return value - (1 << 64) if value >= (1 << 63) else value
