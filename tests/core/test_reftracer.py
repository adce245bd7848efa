"""The reference tracer (3.13+): an object reused from a free list gets the
traceback of the code that created it, as the stdlib's tracer gives it; ours
shares the interpreter's one tracer slot with other tools in any order."""

from __future__ import annotations

import gc
import sys
import tracemalloc as stdlib_tracemalloc
from types import ModuleType

import pytest

HAVE_REFTRACER = sys.version_info >= (3, 13)
needs_reftracer = pytest.mark.skipif(
    not HAVE_REFTRACER, reason="PyRefTracer_SetTracer is new in 3.13"
)


def _reused_list() -> tuple[list[int], int]:
    """A list object that reuses the block of one just destroyed."""
    gc.collect()  # empties the free lists
    obj: list[int] | None = []
    obj = None
    obj = []
    return obj, sys._getframe().f_lineno - 1


def _line_of(core: ModuleType, obj: object) -> int | None:
    frames = core.get_object_traceback(obj)
    return None if frames is None else frames[0][1]


@pytest.mark.xfail(
    not HAVE_REFTRACER,
    strict=True,
    reason="before 3.13 the interpreter reports no object reused from a free list",
)
def test_an_object_from_a_free_list_has_its_creators_traceback(core: ModuleType) -> None:
    core.start(1)
    obj, line = _reused_list()
    assert _line_of(core, obj) == line


@pytest.mark.xfail(
    strict=True,
    reason="sample mode installs no reference tracer: it would cost more than sampling "
    "(every object created and destroyed calls it); a sampled block a free list hands "
    "back keeps the traceback of its allocation",
)
def test_sample_mode_leaves_a_reused_block_with_its_allocation_traceback(
    core: ModuleType,
) -> None:
    core.start(1, "sample", 1)  # every block sampled: the reused block has a trace
    assert not core._reftracer_on_top()
    obj, line = _reused_list()
    assert _line_of(core, obj) == line


def test_the_agents_profile_leaves_a_reused_block_with_its_allocation_traceback(
    core: ModuleType,
) -> None:
    """The agent exports no re-stamped attribution: its profile installs no
    reference tracer (its cost: core.md, "Profiles"; its bound:
    test_free_lists.py)."""
    core.start(1, profile="agent")
    assert not core._reftracer_on_top()
    obj, line = _reused_list()
    assert _line_of(core, obj) == line - 2  # the line that allocated the block


@needs_reftracer
def test_the_dropin_started_over_the_agents_profile_re_stamps(core: ModuleType) -> None:
    core.start(1, profile="agent")
    core.start(1)
    assert core._reftracer_on_top()
    obj, line = _reused_list()
    assert _line_of(core, obj) == line


@needs_reftracer
def test_the_agents_profile_under_another_tool_passes_through(
    core: ModuleType, hwtest: ModuleType
) -> None:
    """Ours left in the chain under another tool's tracer (started by the
    drop-in, then buried) re-stamps nothing once the agent's profile
    traces."""
    core.start(1)
    hwtest.other_tracer_install()
    try:
        core.stop()
        core.start(1, profile="agent")
        before = hwtest.other_tracer_created()
        obj, line = _reused_list()
        assert hwtest.other_tracer_created() > before  # the chain still runs
        assert _line_of(core, obj) == line - 2
    finally:
        core.stop()
        hwtest.other_tracer_uninstall()  # ours back in the slot, passing through
        core.start(1)
        core.stop()  # and out of it
    assert hwtest.ref_tracer_in_slot() == "none"


@needs_reftracer
def test_a_new_object_keeps_its_allocation_traceback(core: ModuleType) -> None:
    class Fresh:  # no free list: its instances are allocated
        pass

    core.start(5)
    obj = Fresh()
    line = sys._getframe().f_lineno - 1
    assert _line_of(core, obj) == line


@needs_reftracer
def test_ours_chains_to_the_tracer_before_it_and_puts_it_back(
    core: ModuleType, hwtest: ModuleType
) -> None:
    assert hwtest.ref_tracer_in_slot() == "none"
    hwtest.other_tracer_install()
    try:
        core.start(1)
        before = hwtest.other_tracer_created()
        obj, line = _reused_list()
        assert hwtest.other_tracer_created() > before  # still called, through ours
        assert _line_of(core, obj) == line
        core.stop()
        assert hwtest.ref_tracer_in_slot() == "other"
    finally:
        assert hwtest.other_tracer_uninstall()
    assert hwtest.ref_tracer_in_slot() == "none"


@needs_reftracer
def test_a_tracer_installed_over_ours_keeps_working_after_our_stop(
    core: ModuleType, hwtest: ModuleType
) -> None:
    core.start(1)
    hwtest.other_tracer_install()  # over ours, chaining to it
    core.stop()
    assert hwtest.ref_tracer_in_slot() == "other"  # left alone
    before = hwtest.other_tracer_created()
    _reused_list()
    assert hwtest.other_tracer_created() > before
    # Restarted under the other tool, then over it: ours -> other -> ours loops
    # back, and must stop there.
    core.start(1)
    obj, line = _reused_list()
    assert _line_of(core, obj) == line
    assert core._reftracer_on_top()  # over the other one
    core.stop()
    assert hwtest.ref_tracer_in_slot() == "other"
    assert hwtest.other_tracer_uninstall()
    assert core._reftracer_on_top()  # passing through
    core.start(1)  # ours is on top already: not installed twice
    core.stop()
    assert hwtest.ref_tracer_in_slot() == "none"


@needs_reftracer
def test_the_stdlib_tracer_started_over_ours_works_and_ours_comes_back(
    core: ModuleType, hwtest: ModuleType
) -> None:
    core.start(1)
    assert core._reftracer_on_top()
    stdlib_tracemalloc.start(1)
    try:
        obj, line = _reused_list()
        traceback = stdlib_tracemalloc.get_object_traceback(obj)
        assert traceback is not None and traceback[0].lineno == line
    finally:
        stdlib_tracemalloc.stop()
    emptied = hwtest.ref_tracer_in_slot() == "none"  # 3.13.0 leaves its tracer there
    core.take_snapshot()  # puts ours back in an empty slot
    assert core._reftracer_on_top() == emptied
    if emptied:
        obj, line = _reused_list()
        assert _line_of(core, obj) == line
    core.stop()
    assert not core._reftracer_on_top()


@needs_reftracer
def test_an_object_heapwatch_reuses_from_a_free_list_leaves_the_services_memory(
    core: ModuleType,
) -> None:
    # Given a list made by the service (traced) and destroyed: its block
    # waits in the free list with the service's trace
    core.start(1)
    gc.collect()
    obj: list[int] | None = []
    assert _line_of(core, obj) is not None
    obj = None
    # When one of heapwatch's own threads (here, this one, marked so) takes
    # the block back for an object of its own
    core.set_thread_traced(False)
    try:
        mine: list[int] = []
    finally:
        core.set_thread_traced(True)
    # Then the block is heapwatch's: neither the service's old line nor
    # heapwatch's new one shows it
    assert _line_of(core, mine) is None
    core._check_invariants()
