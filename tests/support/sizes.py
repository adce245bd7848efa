"""Sizes of the blocks that test allocations ask the allocator for."""

from __future__ import annotations

import sys

# bytearray(n) allocates its own n + 1 byte buffer up to 3.14; from 3.15 it
# holds a bytes object of n bytes, header and trailing NUL included.
BYTEARRAY_OVERHEAD = sys.getsizeof(b"") if sys.version_info >= (3, 15) else 1


def bytearray_block(n: int) -> int:
    """Bytes of the block that bytearray(n) allocates for its contents."""
    return n + BYTEARRAY_OVERHEAD
