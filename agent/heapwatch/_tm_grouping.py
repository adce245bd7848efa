"""Pure-Python grouping of raw traces: the path of hand-built and loaded snapshots.

It follows the stdlib's ``Snapshot._group_by`` (keys, cumulative counting of
every frame, repeats included) and weighs each trace exactly as the C core's
``hw_weigh`` (agent/csrc/tracer.c) does, so that for the same traces this
path and ``_core.Snapshot.group()`` give identical statistics:

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

from heapwatch._tm_objects import Statistic, Traceback

if TYPE_CHECKING:
    from collections.abc import Iterable

    from heapwatch._core import Frames, KeyType, Mode, RawTrace

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


def group_traces(
    traces: Iterable[RawTrace], key_type: KeyType, cumulative: bool, weigh: Weigh
) -> dict[Traceback, Statistic]:
    """The traces' statistics grouped by key_type, keyed by their Traceback.

    Sums are kept per raw key, so a Traceback is built once per group, not
    once per trace.  key_type and cumulative must have passed check_key_type().
    """
    sums: dict[Frames, list[int]] = {}

    def add(key: Frames, est_size: int, count_fp: int) -> None:
        acc = sums.get(key)
        if acc is None:
            sums[key] = [est_size, count_fp]
        else:
            acc[0] += est_size
            acc[1] += count_fp

    by_filename = key_type == "filename"
    for _domain, size, frames, _total_nframe in traces:
        est_size, count_fp = weigh(size)
        if cumulative:
            # As the stdlib: every frame counts, a repeated frame each time.
            for filename, lineno in frames:
                add(((filename, 0 if by_filename else lineno),), est_size, count_fp)
        elif key_type == "traceback":
            add(frames, est_size, count_fp)
        else:
            filename, lineno = frames[0]
            add(((filename, 0 if by_filename else lineno),), est_size, count_fp)
    grouped = {}
    for key, (size_sum, count_fp_sum) in sums.items():
        traceback = Traceback(key)
        grouped[traceback] = Statistic(traceback, size_sum, round_count(count_fp_sum))
    return grouped
