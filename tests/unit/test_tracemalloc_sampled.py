"""The pure-Python weighing of sampled traces: exact llround, the core's
weights, and statistics of hand-built sampled snapshots."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heapwatch import tracemalloc as hw_tm
from heapwatch.formats.estimates import COUNT_ONE, llround, round_count, sample_weight


def reference_llround(x: float) -> int:
    """Round half away from zero, in exact rational arithmetic."""
    exact = Fraction(x)
    magnitude = abs(exact)
    whole = math.floor(magnitude)
    if magnitude - whole >= Fraction(1, 2):
        whole += 1
    return whole if exact >= 0 else -whole


@pytest.mark.parametrize(
    "x",
    [
        0.0,
        0.5,
        1.5,
        2.5,
        -0.5,
        -2.5,
        0.49999999999999994,  # floor(x + 0.5) gets this one wrong
        -0.49999999999999994,
        math.nextafter(2.5, 0.0),
        math.nextafter(2.5, 3.0),
        4503599627370495.5,  # 2**52 - 0.5: the last doubles with a half
        4503599627370497.0,
        1e18,
    ],
)
def test_llround_rounds_halves_away_from_zero_exactly(x: float) -> None:
    assert llround(x) == reference_llround(x)


@given(st.floats(min_value=-(2.0**62), max_value=2.0**62, allow_nan=False))
def test_llround_matches_exact_rounding(x: float) -> None:
    assert llround(x) == reference_llround(x)


def test_round_count_rounds_fixed_point_halves_up() -> None:
    assert round_count(0) == 0
    assert round_count(COUNT_ONE // 2 - 1) == 0
    assert round_count(COUNT_ONE // 2) == 1
    assert round_count(3 * COUNT_ONE) == 3


@given(size=st.integers(1, 2**30), interval=st.integers(1, 2**24))
def test_a_sampled_block_weighs_at_least_itself(size: int, interval: int) -> None:
    est_size, count_fp = sample_weight(size, interval)
    assert est_size >= size
    assert count_fp >= COUNT_ONE


@given(size=st.integers(1, 2**30), interval=st.integers(1, 2**24))
def test_sample_weight_is_size_over_probability(size: int, interval: int) -> None:
    p = -math.expm1(-size / interval)
    est_size, count_fp = sample_weight(size, interval)
    # Within a rounding of the exact values (two double roundings, one llround).
    assert abs(est_size - size / p) <= 1 + size / p * 2**-50
    assert abs(count_fp - COUNT_ONE / p) <= 1 + COUNT_ONE / p * 2**-50


def test_blocks_far_above_the_interval_weigh_as_themselves() -> None:
    assert sample_weight(64 * 4096, 4096) == (64 * 4096, COUNT_ONE)


def test_an_empty_block_weighs_as_one_byte_of_probability() -> None:
    # The core's rule for size 0: p = 1 / interval.
    assert sample_weight(0, 4096) == (0, 4096 * COUNT_ONE)


TRACES = [
    (0, 100, (("a.py", 1),), 1),
    (0, 100, (("a.py", 1),), 1),
    (0, 3000, (("a.py", 1),), 1),
    (0, 50000, (("b.py", 2), ("a.py", 9)), 2),
]


def test_sampled_statistics_sum_the_weights_of_their_traces() -> None:
    snapshot = hw_tm.Snapshot(TRACES, 2, mode="sample", sample_interval=4096)
    by_line = {str(s.traceback): (s.size, s.count) for s in snapshot.statistics("lineno")}
    weights = [sample_weight(size, 4096) for _, size, _, _ in TRACES]
    a_size = sum(w[0] for w in weights[:3])
    a_count = (sum(w[1] for w in weights[:3]) + COUNT_ONE // 2) >> 20
    assert by_line == {
        "a.py:1": (a_size, a_count),
        "b.py:2": (weights[3][0], round_count(weights[3][1])),
    }
    # Small sampled blocks stand for many: a.py:1 is ~2 * 41 + 2 blocks.
    assert a_count > 3


def test_sampled_cumulative_statistics_weigh_each_frame() -> None:
    snapshot = hw_tm.Snapshot(TRACES, 2, mode="sample", sample_interval=4096)
    stats = {str(s.traceback): (s.size, s.count) for s in snapshot.statistics("lineno", True)}
    est, count_fp = sample_weight(50000, 4096)
    assert stats["a.py:9"] == stats["b.py:2"] == (est, round_count(count_fp))


def test_the_same_traces_in_exact_mode_count_blocks_and_bytes() -> None:
    snapshot = hw_tm.Snapshot(TRACES, 2)
    by_line = {str(s.traceback): (s.size, s.count) for s in snapshot.statistics("lineno")}
    assert by_line == {"a.py:1": (3200, 3), "b.py:2": (50000, 1)}


def test_sampled_compare_to_diffs_estimates() -> None:
    old = hw_tm.Snapshot(TRACES[:1], 1, mode="sample", sample_interval=4096)
    new = hw_tm.Snapshot(TRACES[:2], 1, mode="sample", sample_interval=4096)
    (diff,) = new.compare_to(old, "lineno")
    est, count_fp = sample_weight(100, 4096)
    assert (diff.size, diff.size_diff) == (2 * est, est)
    assert (diff.count, diff.count_diff) == (
        round_count(2 * count_fp),
        round_count(2 * count_fp) - round_count(count_fp),
    )
