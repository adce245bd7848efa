"""Base-128 varints (LEB128), the one encoder of heapwatch's binary formats.

The dump format (``heapwatch.formats.dump``) and protocol buffers (pprof,
``heapwatch.formats.protobuf``) write integers the same way; each reader
keeps its own decoder, because each bounds what it accepts differently.
"""

from __future__ import annotations

__all__ = ["INT64_MIN", "UINT64_MAX", "encode_varint"]

UINT64_MAX = (1 << 64) - 1
INT64_MIN = -(1 << 63)

# Most varints written for a profile (ids, string indices, small line numbers)
# are below 128; one preallocated bytes object each skips the loop below.
_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))


def encode_varint(value: int) -> bytes:
    """The base-128 varint encoding of ``value``.

    ``value`` must fit an int64 or a uint64. A negative value is written as its
    64-bit two's complement (ten bytes), which is how protobuf encodes negative
    ``int64`` fields; readers turn it back with ``heapwatch.formats.protobuf.to_int64``.
    """
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if value < 0:
        if value < INT64_MIN:
            raise ValueError(f"{value} does not fit in an int64")
        value &= UINT64_MAX
    elif value > UINT64_MAX:
        raise ValueError(f"{value} does not fit in a uint64")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
