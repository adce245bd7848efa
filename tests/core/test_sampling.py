"""Sampling mode: the estimates are unbiased and accurate.

A block of s bytes is sampled with probability p = 1 - exp(-s / I) and then
weighs s / p bytes, so the estimate of a site is unbiased with variance
sum(s**2 * (1 - p) / p) over its blocks.  The tests compare against exact
tracing of the same workload, with tolerances from Bernstein's inequality
(_tolerance): a false failure is a one-in-a-million event per check.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def site_a(n: int) -> bytearray:
    return bytearray(n)


def site_b(n: int) -> bytearray:
    return bytearray(n)


def site_c(n: int) -> bytearray:
    return bytearray(n)


SITES: list[Callable[[int], bytearray]] = [site_a, site_b, site_c]


def _line(site: Callable[[int], bytearray]) -> tuple[str, int]:
    return (__file__, site.__code__.co_firstlineno + 1)


def _run(
    core: ModuleType, stream: list[tuple[int, int, int]]
) -> tuple[dict[tuple[str, int], int], list[bytearray]]:
    keep = [SITES[site](size) for site, size, count in stream for _ in range(count)]
    stats = core.take_snapshot(traces=False).group("lineno").statistics()
    return {frames[0]: size for frames, size, _c in stats}, keep


def _variance(block_sizes: list[int], interval: int) -> float:
    total = 0.0
    for s in block_sizes:
        p = -math.expm1(-s / interval)
        total += s * s * (1 - p) / p
    return total


def _tolerance(block_sizes: list[int], interval: int, rounds: int = 1) -> float:
    """How far the mean of `rounds` estimates of a site may stray from its
    exact size, with a one-in-a-million chance.

    An estimate sums independent terms, one per block and round, each 0 or
    the block's weight s / p, so Bernstein's inequality bounds it with the
    variance and the largest weight.  Five standard errors of a normal law
    understate that tail when a few small blocks make the estimate: one
    sampled 56-byte block weighs about `interval` bytes on its own."""
    log_term = math.log(2e6)
    variance = rounds * _variance(block_sizes, interval)
    weight = max((s / -math.expm1(-s / interval) for s in block_sizes), default=0.0)
    linear = log_term * weight / 3
    return (linear + math.sqrt(linear * linear + 2 * log_term * variance)) / rounds


streams = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 300_000), st.integers(1, 40)),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stream=streams)
def test_estimates_converge_to_the_exact_sizes(
    core: ModuleType, stream: list[tuple[int, int, int]]
) -> None:
    interval = 32 * 1024
    rounds = 40
    core.stop()
    core.start(1, "exact")
    exact, keep = _run(core, stream)
    core.stop()
    del keep
    sums: dict[tuple[str, int], float] = {}
    for _ in range(rounds):
        core.start(1, "sample", interval)  # each start reseeds the sampler
        estimate, keep = _run(core, stream)
        core.stop()
        del keep
        for site in SITES:
            sums[_line(site)] = sums.get(_line(site), 0.0) + estimate.get(_line(site), 0)
    for index, site in enumerate(SITES):
        key = _line(site)
        # bytearray(n) allocates a 56-byte object (pymalloc) and an n+1 byte buffer
        blocks = [n + 1 for s, n, c in stream if s == index for _ in range(c)]
        blocks += [56] * len(blocks)
        mean = sums[key] / rounds
        tolerance = _tolerance(blocks, interval, rounds) + 64
        assert abs(mean - exact.get(key, 0)) <= tolerance, (key, mean, exact.get(key))


WORKLOAD = [  # (block size, count): about 203 MB over a dozen sites
    (64, 32768),
    (200, 20000),
    (500, 10000),
    (1024, 8000),
    (2048, 1200),
    (4096, 4000),
    (8192, 2500),
    (16384, 1500),
    (51200, 400),
    (102400, 300),
    (1048576, 40),
    (3145728, 10),
]


def _make_sites() -> list[Callable[[int, int], list[bytearray]]]:
    namespace: dict[str, object] = {}
    source = "".join(
        f"def site{i}(size, count):\n    return [bytearray(size) for _ in range(count)]\n"
        for i in range(len(WORKLOAD))
    )
    exec(compile(source, "<accuracy-sites>", "exec"), namespace)
    return [namespace[f"site{i}"] for i in range(len(WORKLOAD))]  # type: ignore[misc]


@pytest.mark.slow
def test_sampled_sites_within_ten_percent_of_exact(core: ModuleType) -> None:
    # Given a workload of ~200 MB over a dozen sites, traced exactly,
    sites = _make_sites()
    interval = 1024
    core.start(1, "exact")
    live = [site(size, count) for site, (size, count) in zip(sites, WORKLOAD)]
    exact = {
        f[0]: size for f, size, _c in core.take_snapshot(traces=False).group("lineno").statistics()
    }
    core.stop()
    del live
    # when the same workload is traced in sample mode,
    core.start(1, "sample", interval)
    live = [site(size, count) for site, (size, count) in zip(sites, WORKLOAD)]
    estimate = {
        f[0]: size for f, size, _c in core.take_snapshot(traces=False).group("lineno").statistics()
    }
    core.stop()
    del live
    # then every site holding at least 1% of the memory is within ±10%.
    # (At a 1 KiB interval the smallest such site, 2 MB of 64-byte blocks,
    # gets ~2000 samples: 10% is 4.5 standard errors.)
    total = sum(size for (name, _l), size in exact.items() if name == "<accuracy-sites>")
    assert total >= 200_000_000
    checked = 0
    for key, size in exact.items():
        if key[0] != "<accuracy-sites>" or size < total / 100:
            continue
        checked += 1
        assert abs(estimate.get(key, 0) - size) <= size / 10, (key, size, estimate.get(key))
    assert checked == len(WORKLOAD)


@pytest.mark.slow
def test_default_interval_estimates_large_sites(core: ModuleType) -> None:
    # At the 512 KiB default, a 100 MB site of 1 MiB blocks is within ±10%
    # (about 100 samples of weight ~1.5 MiB: 10% is ~5 standard errors).
    core.start(1, "sample")
    keep = [site_a(1 << 20) for _ in range(100)]
    stats = core.take_snapshot(traces=False).group("lineno").statistics()
    estimate = {f[0]: size for f, size, _c in stats}.get(_line(site_a), 0)
    exact = 100 * ((1 << 20) + 1 + 56)
    blocks = [(1 << 20) + 1] * 100
    assert abs(estimate - exact) <= _tolerance(blocks + [56] * 100, 512 * 1024)
    del keep


def test_traced_memory_and_peak_are_estimates_too(core: ModuleType) -> None:
    core.start(1, "sample", 4096)
    keep = [site_b(100_000) for _ in range(200)]
    current, peak = core.get_traced_memory()
    assert 0.8 * 20_000_000 < current < 1.2 * 20_000_000 + 5_000_000
    assert peak >= current
    del keep


def test_unsampled_blocks_are_not_traced(core: ModuleType) -> None:
    core.start(1, "sample", 1 << 30)
    keep = [bytearray(16) for _ in range(10_000)]
    stats = core.get_stats()
    assert stats["live_traces"] < 10
    del keep


def _one_block_per_thread(keep: list[bytes], threads: int) -> None:
    import threading

    for _ in range(threads):
        thread = threading.Thread(target=lambda: keep.append(bytes(4096)))
        thread.start()
        thread.join()


def test_short_lived_threads(core: ModuleType) -> None:
    # Successive short-lived threads reuse their pthread ids; each must still
    # draw its own sample points, or a thread-per-request server's leak is
    # never (or always) sampled.
    interval = 16384
    core.start(1, "sample", interval)
    keep: list[bytes] = []
    _one_block_per_thread(keep, 2000)
    stats = core.take_snapshot(traces=False).group("lineno").statistics()
    line = (__file__, _one_block_per_thread.__code__.co_firstlineno + 4)
    estimate = {f[0]: size for f, size, _c in stats}.get(line, 0)
    exact = 2000 * (4096 + 33)  # bytes(4096) is one block: header + data
    blocks = [4096 + 33] * 2000
    assert abs(estimate - exact) <= _tolerance(blocks, interval), estimate


def test_restart_forgets_the_countdown_of_the_previous_session(core: ModuleType) -> None:
    core.start(1, "sample", 32 * 1024 * 1024)
    warm = [bytearray(100) for _ in range(100)]
    core.stop()
    # A countdown drawn at 32 MiB must not outlive the session.
    core.start(1, "sample", 256)
    keep = [bytearray(200) for _ in range(700)]
    assert core.get_stats()["live_traces"] > 100
    del keep, warm


def test_a_mode_change_closes_the_sampling_fast_path(core: ModuleType) -> None:
    # A thread on the sampling fast path (one compare per hook) must leave it
    # the moment the mode changes, or exact tracing would miss its blocks.
    core.start(1, "sample", 1 << 30)
    warm = [bytearray(64) for _ in range(1000)]
    assert core.get_stats()["live_traces"] < 10
    core.stop()
    core.start(1, "exact")
    keep = [bytearray(64) for _ in range(1000)]
    assert core.get_stats()["live_traces"] >= 1000
    core.stop()
    core.start(1, "sample", 1 << 30)
    more = [bytearray(64) for _ in range(1000)]
    assert core.get_stats()["live_traces"] < 10
    del warm, keep, more


def _grown(items: int) -> list[int]:
    grown: list[int] = []
    for i in range(items):
        grown.append(i)  # list growth: realloc, nested in PyMem_RawRealloc past 512 bytes
    return grown


def test_blocks_grown_by_realloc_are_estimated_like_the_others(core: ModuleType) -> None:
    line = (__file__, _grown.__code__.co_firstlineno + 3)

    def site_bytes() -> tuple[int, list[list[int]]]:
        keep = [_grown(1000) for _ in range(1000)]
        stats = core.take_snapshot(traces=False).group("lineno").statistics()
        return {f[0]: size for f, size, _c in stats}.get(line, 0), keep

    core.start(1, "exact")
    exact, keep = site_bytes()
    sizes = [t[1] for t in core.take_snapshot().traces() if t[2][0] == line]
    core.stop()
    del keep
    interval = 64 * 1024
    core.start(1, "sample", interval)
    estimate, keep = site_bytes()
    assert exact > 7_000_000 and len(sizes) == 1000
    # Each realloc is a new draw that keeps or drops the block's trace, so a
    # block counts as sampled with the probability of its final size.
    assert abs(estimate - exact) <= _tolerance(sizes, interval)
    del keep
