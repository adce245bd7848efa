"""What the agent's profile attributes to a line when objects reuse blocks
from a free list (core.md, "Profiles").

It re-stamps nothing: a block keeps the traceback of the line that
allocated it, through every object a free list later makes in it.  When one
line's objects are gone before another line's are made, the first line
keeps at most what the free lists hold, their capacity; when two lines take
turns (a temporary freed at one, while another keeps what it makes), the
blocks pass from one to the other at every turn, and no capacity bounds what
the first line is credited with.  Floats show both: one free list on every
version, of 100 blocks of 24 bytes.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from types import ModuleType

import pytest

FLOAT_FREE_LIST = 100  # blocks, 3.9 to 3.15 (core.md's table)
FLOAT_BLOCK = sys.getsizeof(1.5)  # 24: no GC header
BOUND = FLOAT_FREE_LIST * FLOAT_BLOCK

HAVE_REFTRACER = sys.version_info >= (3, 13)


def _line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if line.endswith(f"# {marker}"))


def _bytes_at(core: ModuleType, line: int) -> int:
    return sum(
        size
        for _d, size, frames, _t in core.take_snapshot().traces()
        if frames[0] == (__file__, line)
    )


def _one_line_then_another() -> list[float]:
    """1000 floats made at one line and dropped, then 5000 kept from
    another."""
    holder: list[float | None] = [None] * 1000
    for i in range(1000):
        # Floats only: float(i) would also make its arguments' tuple (3.9),
        # which a free list keeps too.
        holder[i] = i * 0.5 + 0.25  # FIRST
    holder = []
    return [i * 0.25 + 0.125 for i in range(5000)]


def _lines_taking_turns() -> list[float]:
    """A temporary float at one line, freed at each turn, while the next
    line keeps a float."""
    kept: list[float] = []
    temporary = 0.0
    for i in range(5000):
        temporary = i * 0.5 + 0.25  # TEMPORARY
        kept.append(i * 0.25 + 0.125)
    del temporary
    return kept


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_a_line_whose_objects_are_gone_keeps_at_most_the_free_lists_capacity(
    core: ModuleType, mode: str
) -> None:
    gc.collect()  # empties the free lists
    core.start(1, mode, 1, profile="agent")  # sample interval 1: every block
    kept = _one_line_then_another()
    credited = _bytes_at(core, _line("FIRST"))
    # More than nothing: the next line's floats took the blocks left in the
    # free list without a re-stamp.
    assert 0 < credited <= BOUND, (credited, BOUND)
    del kept


@pytest.mark.skipif(not HAVE_REFTRACER, reason="re-stamps need the 3.13 reference tracer")
def test_the_dropin_profile_re_stamps_what_the_agent_leaves(core: ModuleType) -> None:
    gc.collect()
    core.start(1)
    kept = _one_line_then_another()
    assert _bytes_at(core, _line("FIRST")) == 0
    del kept


@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_lines_taking_turns_are_bounded_by_no_capacity(core: ModuleType, mode: str) -> None:
    """The documented limit of the bound: the kept floats are credited to
    the temporary's line, far past the free list's capacity."""
    gc.collect()
    core.start(1, mode, 1, profile="agent")
    kept = _lines_taking_turns()
    assert _bytes_at(core, _line("TEMPORARY")) > 10 * BOUND
    del kept
