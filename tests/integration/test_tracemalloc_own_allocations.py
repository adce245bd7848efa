"""The stdlib's idiom for hiding the tracer's own allocations,
``snapshot.filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))``,
against both tracers."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def test_the_idiom_hides_the_tracers_own_snapshot_objects(tm: ModuleType) -> None:
    # Given two snapshots, the first alive while the second is taken
    tm.start(5)
    first = tm.take_snapshot()
    data = [str(i) * 10 for i in range(1000)]
    second = tm.take_snapshot()
    # When both are filtered the stdlib's way and compared
    own = (tm.Filter(False, tm.__file__),)
    diffs = second.filter_traces(own).compare_to(first.filter_traces(own), "lineno")
    # Then what grew is the test's data, not the tracer's bookkeeping
    assert data
    tracer_dir = tm.__file__.rsplit("/", 1)[0] if "heapwatch" in tm.__name__ else tm.__file__
    shown = [str(d) for d in diffs if d.traceback[0].filename.startswith(tracer_dir)]
    assert shown == []


def test_a_snapshot_holds_nothing_the_tracer_allocated_to_take_it(tm: ModuleType) -> None:
    # Given the documentation's "top 10" example
    tm.start()
    data = [str(i) * 10 for i in range(1000)]
    snapshot = tm.take_snapshot()
    tm.stop()
    # Then no statistic is the tracer's own (the stdlib's take_snapshot
    # allocates nothing that lives before its traces are copied)
    tracer_dir = tm.__file__.rsplit("/", 1)[0] if "heapwatch" in tm.__name__ else tm.__file__
    stats = snapshot.statistics("lineno")
    assert data
    own = [str(s) for s in stats if s.traceback[0].filename.startswith(tracer_dir)]
    assert own == []


def test_taking_and_dumping_a_snapshot_leaves_nothing_of_the_tracer(tmp_path: Path) -> None:
    # Given a snapshot taken and dumped, then gone (what free lists keep of
    # the call's objects stays traced: the stdlib's next snapshot shows 64 B
    # of its own tracemalloc.py; heapwatch's work is its own, untraced)
    from heapwatch import tracemalloc as tm

    tm.start()
    data = [str(i) * 10 for i in range(1000)]
    tm.take_snapshot().dump(str(tmp_path / "first"))
    # When the next snapshot is taken
    second = tm.take_snapshot()
    tm.stop()
    # Then it shows nothing that the tracer's package allocated for the first
    package = tm.__file__.rsplit("/", 2)[0]
    stats = second.statistics("lineno")
    assert data
    own = [str(s) for s in stats if s.traceback[0].filename.startswith(package)]
    assert own == []
