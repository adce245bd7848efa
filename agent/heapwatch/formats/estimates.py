"""What a sampled trace stands for: its estimated bytes and blocks.

A trace of a sample-mode snapshot holds the size of the block that was
sampled; it is weighed exactly as the C core's ``hw_weigh``
(agent/csrc/tracer.c) weighs it, so that dumps, conversions and the drop-in's
pure-Python statistics agree with ``_core.Snapshot.group()`` to the byte:

* exact mode: a trace weighs its size and one block;
* sample mode: a block of ``size`` bytes was sampled with probability
  ``p = -expm1(-size / interval)`` (``1 / interval`` for size 0), so it weighs
  ``llround(size * (1 / p))`` bytes and ``llround((1 / p) * 2**20)`` blocks in
  fixed point.  A group's count is its fixed-point sum rounded to the nearest
  block, half up: ``(sum + 2**19) >> 20``.

The float operations are the C core's, in the same order, on IEEE doubles,
and ``llround`` is computed exactly: both sides round the same doubles.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from heapwatch._core import Mode

__all__ = [
    "COUNT_ONE",
    "COUNT_SHIFT",
    "Weigh",
    "llround",
    "round_count",
    "sample_weight",
    "weigher",
]

COUNT_SHIFT = 20
COUNT_ONE = 1 << COUNT_SHIFT

Weigh = Callable[[int], tuple[int, int]]


def llround(x: float) -> int:
    """C's llround: the nearest integer, halves away from zero, computed exactly.

    math.modf splits a double exactly, so no rounding happens before the
    comparison with 0.5 (floor(x + 0.5) rounds 0.49999999999999994 up).
    """
    fraction, whole = math.modf(x)
    if abs(fraction) >= 0.5:
        whole += math.copysign(1.0, x)
    return int(whole)


def sample_weight(size: int, interval: int) -> tuple[int, int]:
    """(estimated bytes, estimated blocks in 2**-20 units) of one sampled block."""
    p = -math.expm1(-float(size) / float(interval))
    if not p > 0.0:
        p = 1.0 / float(interval)  # size 0: weighed as a 1-byte block, as the core does
    weight = 1.0 / p
    return llround(float(size) * weight), llround(weight * float(COUNT_ONE))


def weigher(mode: Mode, interval: int) -> Weigh:
    """The weight function of a snapshot's mode, memoised per block size."""
    if mode == "exact":
        return lambda size: (size, COUNT_ONE)
    cache: dict[int, tuple[int, int]] = {}

    def weigh(size: int) -> tuple[int, int]:
        try:
            return cache[size]
        except KeyError:
            weight = cache[size] = sample_weight(size, interval)
            return weight

    return weigh


def round_count(count_fp: int) -> int:
    """A fixed-point block count rounded to whole blocks, as hw_count_round."""
    return (count_fp + COUNT_ONE // 2) >> COUNT_SHIFT
