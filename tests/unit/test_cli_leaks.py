"""``heapwatch leaks``: the agent's leak score, offline, from the ages in a
series of dumps.  A model process runs under the agent (the model source, a
clock moved by hand) while dumps of its traces are written at four of its
cycles: the command scores the leak as the agent did, to the last digit, and
suspects neither the churn nor a cache that stopped filling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from heapwatch.agent import agent as agent_module
from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.cli import leaks as cli_leaks
from heapwatch.cli import main
from heapwatch.formats.dump import AgeClock, DumpHeader, write_dump
from heapwatch.formats.estimates import round_count, sample_weight
from support.agent_model import FakeClock, ModelSource
from support.cli_runner import run_cli
from support.leak_recording import record_ages

LEAK, CHURN, CACHE = ("app.py", 10), ("app.py", 20), ("cache.py", 5)
TTL = ("ttl.py", 7)  # a cache whose entries expire: turned over
INTERVAL = 65536
DUMPED_AT = (40, 60, 80, 100)  # over the agent's window, 60 s: under 0.45 of it apart


def dump_model(
    path: Path, source: ModelSource, now: float, sizes: dict[int, int], late: float = 0.0
) -> str:
    """The model's live memory as the agent's dump would hold it: one trace
    per block (its real size; ``sizes`` maps the model's bytes back to it)
    with its age, and the clock of epochs of 1 s, the current one begun now;
    the dump taken ``late`` seconds after."""
    traces = [
        ((0, sizes[size], (site,), 1), source.epoch - epoch)
        for site, chunks in source.chunks.items()
        for epoch, size in chunks
    ]
    header = DumpHeader(
        "3.12.1",
        4242,
        now + late,
        source.mode,
        INTERVAL if source.mode == "sample" else 0,
        1,
        {"hostname": "web-1", "leak_window": "60.0s"},
        ages=AgeClock(source.epoch, now, 1.0),
    )
    write_dump(str(path), header, traces)
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    """run_cli, with a JSON answer decoded."""
    status, out, err = run_cli(capsys, *argv)
    return status, json.loads(out) if out.startswith("{") else out, err


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_offline_scores_agree_with_the_agents(
    mode: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Sizes as the model holds them: estimates in sample mode.
    def weighed(real: int) -> int:
        return sample_weight(real, INTERVAL)[0] if mode == "sample" else real

    sizes = {weighed(100_000): 100_000, weighed(1_000_000): 1_000_000}
    entry = weighed(100_000)

    def blocks(real: int, before: int) -> int:
        """The blocks one more of ``before`` blocks of ``real`` bytes adds to
        a line's count as the core estimates it (summed, then rounded), as
        the dumps' traces give it."""
        if mode == "exact":
            return 1
        one = sample_weight(real, INTERVAL)[1]
        return round_count((before + 1) * one) - round_count(before * one)

    def expire(site: tuple[str, int], born: int) -> None:
        """Frees the site's entries allocated at epoch ``born`` (its oldest)."""
        chunks = source.chunks.get(site, [])
        while chunks and chunks[0][0] == born:
            chunks.pop(0)
            size, count = source.sites[site]
            left = len(chunks)
            source.sites[site] = (size - entry, count - blocks(100_000, left))

    # What each tracker was given as ages, cycle by cycle: the agent's and
    # the command's
    agent_ages = record_ages(monkeypatch, agent_module)
    fed = record_ages(monkeypatch, cli_leaks)
    source = ModelSource(mode, INTERVAL)
    clock = FakeClock(1_700_000_000.0)
    config = AgentConfig(
        exporters=(), interval=1.0, leak_window=60.0, mode=mode, sample_interval=INTERVAL
    )
    agent = Agent(config, source=source, exporters=[], clock=clock, timer=clock)
    paths = []
    # Given a process leaking 100 kB an epoch, churning 1 MB, and a cache
    # that filled in its first 30 epochs, under the agent (a cycle a second)
    for epoch in range(1, 101):
        agent.run_cycle()
        assert source.epoch == epoch
        if epoch in DUMPED_AT:  # dumped at four cycles
            paths.append(dump_model(tmp_path / f"{epoch}.hwdump", source, clock(), sizes))
        source.allocate(*LEAK, weighed(100_000), blocks(100_000, epoch - 1))
        if epoch > 1:
            source.free(*CHURN, weighed(1_000_000), blocks(1_000_000, 0))
        source.allocate(*CHURN, weighed(1_000_000), blocks(1_000_000, 0))
        if epoch <= 30:
            source.allocate(*CACHE, weighed(100_000), blocks(100_000, epoch - 1))
        # traffic that rises, each entry expiring 40 epochs after it came
        expire(TTL, epoch - 40)
        for _entry in range(epoch // 4 + 1):
            source.allocate(*TTL, entry, blocks(100_000, len(source.chunks.get(TTL, []))))
        clock.advance(1.0)
    online = agent.leak_scores()
    # When the dumps are scored offline
    status, report, err = run(capsys, "leaks", "--json", *reversed(paths))
    # Then the leak is the one suspect, with the agent's own score and rate
    assert (status, err) == (0, "")
    assert [(s["filename"], s["lineno"]) for s in report["suspects"]] == [LEAK]
    (suspect,) = report["suspects"]
    assert online[LEAK].score >= 0.5  # a suspect (sampled: noisier, lower)
    assert suspect["score"] == pytest.approx(online[LEAK].score, abs=1e-9)
    assert suspect["rate"] == pytest.approx(online[LEAK].rate, rel=1e-9)
    assert suspect["series"] == online[LEAK].series
    # and the last dump's ages were scored, the ages the agent's last cycle
    # had (the leak's: 99 blocks of ages 1 to 99)
    # (the leak's tracker's: the lines not seen to keep their memory have
    # one of their own, from the first dump on)
    assert agent_ages[-1] is not None
    fed_leak = [ages for ages in fed if ages is not None and LEAK in ages]
    assert fed_leak[-1][LEAK] == agent_ages[-1][LEAK]
    # and neither the churn nor the caches are suspects, online either (the
    # expiring one grows as steadily as a leak, but what it held 16 epochs
    # ago is gone)
    assert online[CHURN].score < 0.5
    assert online.get(CACHE) is None or online[CACHE].score < 0.5
    assert online[TTL].score < 0.5
    # Its memory is the last dump's: 99 blocks, ages 1 to 99 epochs
    assert suspect["size"] == 99 * weighed(100_000)
    live = 99 if mode == "exact" else round_count(99 * sample_weight(100_000, INTERVAL)[1])
    assert suspect["count"] == live
    assert [(band["low"], band["high"]) for band in suspect["ages"]] == [
        (1, 1),
        (2, 3),
        (4, 7),
        (8, 15),
        (16, 31),
        (32, 63),
        (64, 127),
    ]
    assert sum(band["size"] for band in suspect["ages"]) == suspect["size"]
    assert suspect["ages"][2]["min_seconds"] == 3.0  # 4 epochs of 1 s: 3 whole ones
    assert suspect["tracebacks"] == [
        {"size": suspect["size"], "count": live, "traceback": [list(LEAK)]}
    ]
    assert report["window"] == 60.0


def test_the_text_report_lists_each_suspect_with_its_ages_and_tracebacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = ModelSource("exact", 0)
    paths = []
    for epoch in range(1, 81):
        source.next_epoch()
        if epoch in (20, 40, 60, 80):
            paths.append(
                dump_model(tmp_path / f"{epoch}.hwdump", source, 1e9 + epoch, {100_000: 100_000})
            )
        source.allocate(*LEAK, 100_000)
    status, out, err = run(capsys, "leaks", *paths)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (
        "# 4 dumps of pid 4242, from 2001-09-09 01:47:00 UTC to 2001-09-09 01:48:00 UTC; "
        "the epochs from the ages of what survived"
    )
    assert lines[1] == "Leak suspects (score >= 0.50 over a 60s window): 1"
    assert lines[2].startswith("#1: app.py:10: score ")
    assert lines[2].endswith(" KiB/s, 7714.8 KiB live in 79 blocks")
    assert lines[3] == (
        "    ages in epochs: 1 (>= 0s): 97.7 KiB, 2-3 (>= 1s): 195.3 KiB, "
        "4-7 (>= 3s): 390.6 KiB, 8-15 (>= 7s): 781.2 KiB, 16-31 (>= 15s): 1562.5 KiB, "
        "32-63 (>= 31s): 3125.0 KiB, 64-127 (>= 63s): 1562.5 KiB"
    )
    assert lines[4:] == ["    7714.8 KiB in 79 blocks:", "      app.py:10"]


def _leak_and_cache(tmp_path: Path, dumped: tuple[int, ...], late: float = 0.0) -> list[str]:
    """A process leaking 100 kB an epoch (of 1 s) and a cache keeping its
    last 40 entries of 100 kB, dumped at the epochs ``dumped``, each dump
    taken ``late`` seconds after its epoch began."""
    source = ModelSource("exact", 0)
    paths = []
    for epoch in range(1, max(dumped) + 1):
        source.next_epoch()
        if epoch in dumped:
            path = tmp_path / f"{epoch}.hwdump"
            paths.append(dump_model(path, source, 1e9 + epoch, {100_000: 100_000}, late))
        source.allocate(*LEAK, 100_000)
        source.allocate(*CACHE, 100_000)
        if len(source.chunks[CACHE]) > 40:
            source.chunks[CACHE].pop(0)
    return paths


def test_two_dumps_score_what_they_show_kept_over_the_whole_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given two dumps 10 s apart of a process leaking at one line and
    # turning a cache over at another, its agent's window 60 s
    paths = _leak_and_cache(tmp_path, (90, 100))
    # When they are scored
    status, report, err = run(capsys, "leaks", "--json", *paths)
    # Then the leak, whose memory both dumps show kept, is scored over the
    # agent's window, its memory before the first dump what survived of it
    assert (status, err) == (0, "")
    assert report["window"] == 60.0
    (suspect,) = report["suspects"]
    assert (suspect["filename"], suspect["lineno"]) == LEAK
    assert suspect["score"] >= 0.9
    # and the cache, which freed what it held, is not: the note says why
    # and what would score it
    assert report["notes"][1] == (
        "1 line freed memory held at the first dump, or kept too little since to tell: scored "
        "from the first dump on, not at all: the dumps cover 10.0s, under 0.45 of the 60s "
        "window; dumps over 27.0s or more would score them"
    )


def test_dumps_minutes_apart_give_an_answer_and_say_what_would_give_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given two dumps three minutes apart, each taken 0.75 s into its epoch
    paths = _leak_and_cache(tmp_path, (20, 200), late=0.75)
    # When they are scored, over a window of 2 minutes
    status, report, err = run(capsys, "leaks", "--json", "--window", "2m", *paths)
    # Then the window is the one asked for, and the leak is flagged in it
    assert (status, err) == (0, "")
    assert report["window"] == 120.0
    assert [(s["filename"], s["lineno"]) for s in report["suspects"]] == [LEAK]
    assert report["suspects"][0]["score"] >= 0.9
    # and the cache is not; the note times the dumps as they were taken
    assert report["notes"][1] == (
        "1 line freed memory held at the first dump, or kept too little since to tell: scored "
        "from the first dump on, not at all: the last two dumps were taken 180.0s apart, more "
        "than 0.45 of the 120s window (what was freed between them is not known); dumps at "
        "most 54.0s apart would score them"
    )


def test_leaks_offers_no_pickle_option_it_would_always_refuse(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["leaks", "--allow-pickle", "a.hwdump", "b.hwdump"])
    assert exit.value.code == 2
    assert "--allow-pickle" in capsys.readouterr().err
