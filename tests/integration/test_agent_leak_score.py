"""The leak score through the C core's ages, the agent and a Prometheus
scrape, in this process, on a compressed clock (a 10 s window, cycles every
0.2 s): a leak outside the top sites is suspected and gets its series; a
site that churns does not."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import heapwatch

TOP = 2
BIG_MIB = (48, 40, 32, 24)  # the top 2 by size, then the top 2 by peak


pytestmark = pytest.mark.usefixtures("no_agent")


def leak_more(leaked: list[bytes]) -> None:
    leaked.extend([bytes(1000) for _ in range(100)])


def churn_again() -> list[bytes]:
    return [bytes(1000) for _ in range(1000)]


LEAK_LINE = leak_more.__code__.co_firstlineno + 1
CHURN_LINE = churn_again.__code__.co_firstlineno + 1


def scraped_scores(url: str) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (sample.labels["code_file_path"], sample.labels["code_line_number"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "heapwatch_lineno_leak_score"
    }


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_leak_outside_the_top_is_suspected_and_exported_and_churn_is_not(mode: str) -> None:
    agent = heapwatch.start_agent(
        port=0,
        interval=3600,
        mode=mode,
        sample_interval="64KiB",
        top=TOP,
        leak_window="10s",
        exporters=["prometheus"],
    )
    assert agent is not None
    # Given big flat blocks (four lines) filling the top sites by size and by peak
    big = [bytearray(BIG_MIB[0] << 20)]
    big.append(bytearray(BIG_MIB[1] << 20))
    big.append(bytearray(BIG_MIB[2] << 20))
    big.append(bytearray(BIG_MIB[3] << 20))
    url = agent.metrics_url
    assert url is not None
    leak = (__file__, LEAK_LINE)
    churn = (__file__, CHURN_LINE)
    leaked: list[bytes] = []
    churning = churn_again()
    suspected = None
    started = time.monotonic()
    # When a site leaks 100 kB a cycle and another replaces 1 MB a cycle
    while time.monotonic() - started < 30:
        leak_more(leaked)
        churning = churn_again()
        result = agent.run_cycle()
        sites = {(s.file, s.line): s for s in result.sites}
        # Then churn is never a suspect
        assert churn not in sites or sites[churn].leak_score < 0.5
        if leak in sites and sites[leak].leak_score >= 0.5:
            suspected = result
            break
        time.sleep(0.2)
    # and the leak is, with a series of its own beyond the top sites
    assert suspected is not None, "the leak was never suspected"
    order = [(s.file, s.line) for s in suspected.sites]
    assert order.index(leak) >= 2 * TOP
    assert sites[leak].leak_rate > 0
    scores = scraped_scores(url)
    assert scores[__file__, str(LEAK_LINE)] >= 0.5
    assert scores.get((__file__, str(CHURN_LINE)), 0.0) < 0.5
    assert ("<other>", "0") not in scores
    del big, leaked, churning


def test_the_diff_baseline_kept_between_cycles_holds_no_traces() -> None:
    # Given an agent whose cycles copy every trace (for the ages), keeping
    # its last snapshot for /debug/heapwatch/diff
    agent = heapwatch.start_agent(port=0, interval=3600, mode="exact", exporters=[])
    assert agent is not None
    agent.retain_last_snapshot = True
    # When a cycle runs
    agent.run_cycle()
    # Then what is kept until the next one is a snapshot without the traces
    last = agent.last_snapshot()
    assert last is not None
    assert not last[0].has_traces
