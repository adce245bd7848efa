"""Ages of the agent's dumps, against the C tracer in this process: a dump
carries each live trace's age and the clock of the agent's epochs, and
``heapwatch top --min-age`` and ``/debug/heapwatch/top?min_age=`` select the
memory that is that old, in exact and sample mode."""

from __future__ import annotations

import contextvars
import io
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Callable

import pytest

from heapwatch import _core
from heapwatch import tracemalloc as hw_tm
from heapwatch.agent.agent import Agent
from heapwatch.agent.config import AgentConfig
from heapwatch.cli import main
from heapwatch.formats.dump import iter_dump, read_dump, write_dump
from heapwatch.formats.leaks import Observation
from heapwatch.runtime.routes import current_route, route_id
from heapwatch.server.dumps import DumpService, age_clock, dump_header, iter_traces
from support.leak_recording import record_observations
from support.waiting import wait_for

TOKEN = "test-token-0123456789abcdef"
INTERVAL = 0.2
OLD_DUMP = Path(__file__).parent.parent / "data" / "dump-format-1.0.hwdump"
MODES = pytest.mark.parametrize("mode", ["exact", "sample"])

kept: list[bytearray] = []


def allocate_old(n: int) -> None:
    kept.extend(bytearray(5000) for _ in range(n))  # OLD


def allocate_young(n: int) -> None:
    kept.extend(bytearray(5000) for _ in range(n))  # YOUNG


def line_of(function: object) -> int:
    return function.__code__.co_firstlineno + 1  # type: ignore[attr-defined]


OLD = (__file__, line_of(allocate_old))
YOUNG = (__file__, line_of(allocate_young))


def _started(mode: str, tmp_path: Path, interval: float) -> Agent:
    """An agent serving with a token, every block sampled in sample mode,
    started and past its first cycle."""
    settings = {
        "port": 0,
        "interval": interval,
        "mode": mode,
        "sample_interval": 1 if mode == "sample" else 512 * 1024,  # every block sampled
        "token": TOKEN,
        "dump_dir": str(tmp_path / "dumps"),
    }
    agent = Agent(AgentConfig().replace(**settings))
    assert agent.start()
    try:
        wait_for(lambda: agent.readings().cycles >= 1, timeout=30)
    except BaseException:
        agent.stop()
        raise
    return agent


@pytest.fixture
def agent(mode: str, tmp_path: Path) -> Iterator[Agent]:
    """An agent cycling every INTERVAL (an epoch each), with OLD memory
    a dozen epochs old and YOUNG memory of the last epoch or two."""
    agent = _started(mode, tmp_path, INTERVAL)
    try:
        allocate_old(200)
        start = agent.readings().cycles
        wait_for(lambda: agent.readings().cycles >= start + 12, timeout=60)
        allocate_young(200)
        yield agent
    finally:
        agent.stop()
        kept.clear()


def service_of(agent: Agent) -> DumpService:
    (service,) = [e for e in agent.exporters if isinstance(e, DumpService)]
    return service


def site_ages(
    pairs: Iterator[tuple[tuple[int, int, tuple[tuple[str, int], ...], int], int]],
) -> dict[tuple[str, int], list[int]]:
    """The ages of each line's 5000-byte buffers (the objects and the list's
    array are blocks of other sizes)."""
    out: dict[tuple[str, int], list[int]] = {}
    for trace, age in pairs:
        if 5000 <= trace[1] <= 5100:
            out.setdefault(trace[2][0], []).append(age)
    return out


@MODES
def test_a_taken_snapshot_round_trips_with_its_ages(agent: Agent, mode: str) -> None:
    # Given a snapshot of the core, taken with its traces
    snap = _core.take_snapshot(traces=True)
    header = dump_header(snap, trigger="test", ages=age_clock(snap, time.time(), agent))
    # When it is written as a dump and read back
    out = io.BytesIO()
    write_dump(out, header, iter_traces(snap))
    dump = read_dump(io.BytesIO(out.getvalue()))
    # Then every trace comes back with the age the core gave it
    assert dump.header.ages is not None and dump.header.ages.epoch == snap.epoch
    assert dump.ages is not None
    assert sorted(zip(dump.traces, dump.ages)) == sorted(
        ((d, s, f, t), a) for d, s, f, t, a in snap.traces(ages=True)
    )
    assert dump.header.mode == mode


@MODES
def test_the_agents_dump_carries_ages_and_the_clock_of_its_epochs(agent: Agent, mode: str) -> None:
    # When the agent dumps (as on its signal)
    path = service_of(agent).dump_to_directory()
    header, pairs = iter_dump(path, ages=True)
    ages = site_ages(pairs)  # type: ignore[arg-type]
    # Then the old memory is a dozen epochs old, the young one or two
    assert len(ages[OLD]) == len(ages[YOUNG]) == 200
    assert min(ages[OLD]) >= 12
    assert max(ages[YOUNG]) <= 2
    # and the clock says how long the agent's epochs last, and when the
    # dump's began: no later than the dump
    clock = header.ages
    assert clock is not None
    assert clock.interval == INTERVAL
    assert clock.started <= header.timestamp
    assert clock.min_seconds(min(ages[OLD]), header.timestamp) >= 11 * INTERVAL
    # and the drop-in's Snapshot.load() reads it, ages left aside
    loaded = hw_tm.Snapshot.load(path)
    assert len(loaded.traces) == len(read_dump(path).traces)
    assert (loaded.mode, loaded.sample_interval) == (header.mode, header.sample_interval)


def top(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object], str]:
    try:
        status = main(["top", "--json", "--limit", "1000", *argv])
    except SystemExit as exit:
        status = int(exit.code or 0)
    out, err = capsys.readouterr()
    return status, json.loads(out) if out else {}, err


def lines_of(report: dict[str, object]) -> set[tuple[str, int]]:
    return {(s["filename"], s["lineno"]) for s in report["stats"]}  # type: ignore[attr-defined,index]


@MODES
def test_top_min_age_selects_only_the_old_memory(
    agent: Agent, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = service_of(agent).dump_to_directory()
    # Without --min-age both sites show; with it only the old one
    status, everything, err = top(capsys, path)
    assert (status, err) == (0, "")
    assert {OLD, YOUNG} <= lines_of(everything)
    status, old, err = top(capsys, path, "--min-age", "1s")
    assert (status, err) == (0, "")
    assert OLD in lines_of(old)
    assert YOUNG not in lines_of(old)
    assert old["meta"]["min_age"] == 1.0  # type: ignore[index]
    assert "live memory at least 1s old" in old["notes"][0]  # type: ignore[index]
    # The total is the old memory's
    assert old["total"]["size"] < everything["total"]["size"]  # type: ignore[index]


def get(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


@MODES
def test_the_top_route_min_age_selects_only_the_old_memory(agent: Agent, mode: str) -> None:
    base = agent.serve()
    assert base is not None
    status, body = get(base + "/debug/heapwatch/top?format=json&limit=1000")
    assert status == 200
    assert {OLD, YOUNG} <= lines_of(json.loads(body))
    status, body = get(base + "/debug/heapwatch/top?format=json&limit=1000&min_age=1s")
    assert status == 200, body
    report = json.loads(body)
    assert OLD in lines_of(report)
    assert YOUNG not in lines_of(report)
    status, body = get(base + "/debug/heapwatch/top?min_age=1s")
    assert status == 200
    notes = [line for line in body.splitlines() if line.startswith(b"# ")]
    assert notes[-1].startswith(b"# live memory at least 1s old: traces ")


@MODES
def test_the_top_by_route_with_min_age_holds_only_the_old_routes_memory(
    mode: str, tmp_path: Path
) -> None:
    # Given memory kept under one route a dozen epochs ago, and under
    # another in the last epoch or two
    def under(route: str, allocate: Callable[[int], None]) -> None:
        def request() -> None:
            current_route.set(route_id(route))
            allocate(200)

        contextvars.copy_context().run(request)

    _core.set_route_var(current_route)
    agent = _started(mode, tmp_path, INTERVAL)
    try:
        under("/old/{id}", allocate_old)
        start = agent.readings().cycles
        wait_for(lambda: agent.readings().cycles >= start + 12, timeout=60)
        under("/young/{id}", allocate_young)
        base = agent.serve()
        assert base is not None
        # When the top by route is asked for all memory, then for the old
        status, body = get(base + "/debug/heapwatch/top?key_type=route&format=json")
        assert status == 200, body
        every = {stat["route"]: stat["size"] for stat in json.loads(body)["stats"]}
        status, body = get(base + "/debug/heapwatch/top?key_type=route&format=json&min_age=1s")
        assert status == 200, body
        report = json.loads(body)
    finally:
        agent.stop()
        _core.set_route_var(None)
        kept.clear()
    # Then both routes hold their 200 buffers, and only the old route's are old
    assert every["/old/{id}"] >= 200 * 5000 and every["/young/{id}"] >= 200 * 5000, every
    old = {stat["route"]: stat["size"] for stat in report["stats"]}
    assert old["/old/{id}"] >= 200 * 5000, old
    assert "/young/{id}" not in old, old
    assert "live memory at least 1s old" in report["notes"][0]


def test_a_bad_min_age_names_the_value_and_what_is_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = top(capsys, str(OLD_DUMP), "--min-age", "5 parsecs")
    assert status == 2
    assert "--min-age" in err
    assert "expected a duration from 0s to 8760h (365 days)" in err
    assert "'5 parsecs'" in err
    # A dump without ages cannot be selected by age: one line, status 1
    status, _, err = top(capsys, str(OLD_DUMP), "--min-age", "1m")
    assert status == 1
    assert err.startswith(f"heapwatch top: {str(OLD_DUMP)!r} is a dump written before format 1.1")
    assert "carry no ages" in err


@pytest.mark.parametrize("mode", ["exact"])
def test_the_routes_refuse_a_bad_min_age(agent: Agent, mode: str) -> None:
    base = agent.serve()
    assert base is not None
    status, body = get(base + "/debug/heapwatch/top?min_age=-5s")
    assert status == 400
    assert b"min_age='-5s' is invalid: min_age is a duration from 0s to 8760h" in body
    status, body = get(base + "/debug/heapwatch/diff?min_age=5s")
    assert status == 400
    assert b"unknown parameter 'min_age'" in body


@pytest.fixture
def early_agent(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Agent, list[Mapping[Any, Observation]]]]:
    """An agent with an interval of an hour, and YOUNG memory allocated after
    its first cycle, then a dozen cycles run early (through the API); with
    each cycle's observations as its leak tracker got them."""
    seen = record_observations(monkeypatch)
    agent = _started(mode, tmp_path, 3600)
    try:
        allocate_young(200)
        for _ in range(12):
            agent.run_cycle()
        yield agent, seen
    finally:
        agent.stop()
        kept.clear()


@MODES
def test_cycles_run_early_make_no_memory_older(
    early_agent: tuple[Agent, list[Mapping[Any, Observation]]],
    mode: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    agent, observations = early_agent
    # The dozen cycles ran in the epoch of the first, where YOUNG was allocated
    path = service_of(agent).dump_to_directory()
    header, pairs = iter_dump(path, ages=True)
    assert set(site_ages(pairs)[YOUNG]) == {0}  # type: ignore[arg-type]
    # and the dump's clock has that epoch begin with the first, not the last
    last = agent.readings().result
    assert header.ages is not None and last is not None
    assert header.ages.epoch == last.epoch
    assert header.ages.started == last.epoch_started < last.timestamp
    # so heapwatch top --min-age of the dump does not call it a minute old
    status, everything, err = top(capsys, path)
    assert (status, err) == (0, "")
    assert YOUNG in lines_of(everything)
    status, old, err = top(capsys, path, "--min-age", "60s")
    assert (status, err) == (0, "")
    assert YOUNG not in lines_of(old)
    # nor does /debug/heapwatch/top?min_age=
    base = agent.serve()
    assert base is not None
    status, body = get(base + "/debug/heapwatch/top?format=json&limit=1000&min_age=60s")
    assert status == 200, body
    assert YOUNG not in lines_of(json.loads(body))
    # and the leak score saw it live in each of those cycles, never old
    young = [seen[YOUNG] for seen in observations if YOUNG in seen]
    assert len(young) == 12
    assert all(observation.live >= 200 * 5000 for observation in young)
    assert [observation.old for observation in young] == [0.0] * 12
