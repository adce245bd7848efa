"""The data of the memory page and the HTML report: one shape for both.

``/debug/heapwatch/`` (from a live snapshot and the agent's cycles) and
``heapwatch report`` (from dumps) build the same JSON document here, and the
same script (``heapwatch/server/static/heapwatch.js``) draws it:

* ``frames``: the distinct frames, ``[file, line, function]`` (function ""
  when unknown: dumps keep none, ``function_names`` may find it);
* ``stacks``: ``[[frame ids, outermost first], size, count]``, the biggest
  ``MAX_STACKS`` tracebacks, the rest summed in one ``(other stacks)``
  frame; ``base``, when there is one, the older side in the same shape;
  ``baselines``, ``{"at": unix time, "stacks"}``, older readings the live
  page offers to colour against (an agent keeps them ``fold_stacks``-ed);
* ``sites``: the top lines (``SiteRow``), ``suspects`` the leak suspects,
  ``timeline`` rows ``[unix time, traced, resident, untraced, limit]``.

Stacks come from rows (``heapwatch.formats.rows``) keyed by traceback, or
from the core's ``Snapshot.tracebacks(names=True)``, frames most recent
first as the core gives them.  Names are data: the script puts every one in
the DOM as text, and ``script_json`` makes the document safe inside a
``<script type="application/json">`` element, whatever a name holds.
"""

from __future__ import annotations

import ast
import heapq
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from heapwatch.formats.report import readable_source

if TYPE_CHECKING:
    from heapwatch._core import RawStatistic, RawTracebackInfo

__all__ = [
    "FOLDED_FRAMES",
    "FOLDED_STACKS",
    "MAX_STACKS",
    "OTHER_STACKS",
    "Baseline",
    "FoldedStacks",
    "SiteRow",
    "Stack",
    "SuspectRow",
    "TimelineRow",
    "fold_stacks",
    "function_names",
    "median_age",
    "script_json",
    "stacks_of_rows",
    "stacks_of_tracebacks",
    "unfold_stacks",
    "view_data",
]

MAX_STACKS = 5000
"""Tracebacks a view carries: enough for any picture, bounded for the page."""
OTHER_STACKS = "(other stacks)"

Frame = tuple[str, int, str]
Stack = tuple[tuple[Frame, ...], int, int]
"""(frames most recent first, size, count)."""
TimelineRow = tuple[float, int, Optional[int], Optional[int], Optional[int]]
Baseline = tuple[float, Sequence[Stack]]
"""(unix time, stacks): an older reading the page may colour against."""

FOLDED_STACKS = 500
"""Stacks a folded reading keeps: the biggest, the rest summed."""
FOLDED_FRAMES = 16384
"""Frame references a folded reading holds at most, whatever its depth."""


class SiteRow(NamedTuple):
    """One line of the top sites table."""

    file: str
    line: int
    size: int
    blocks: int
    growth: int | None = None
    """Bytes more than the cycle (or dump) before; None when unknown."""
    peak_share: float | None = None
    """Its part of the traced peak, 0 to 1; None when unknown."""
    leak_score: float | None = None
    age: float | None = None
    """Seconds at least half its bytes have lived; None when unknown."""


class SuspectRow(NamedTuple):
    file: str
    line: int
    score: float
    rate: float
    """Bytes per second its memory grew at over the span scored."""
    size: int


def stacks_of_tracebacks(tracebacks: Iterable[tuple[object, ...]]) -> list[Stack]:
    """Stacks of the core's ``Snapshot.tracebacks(names=True)`` rows,
    ``(domain, frames, total_nframe, size, count)``."""
    stacks = []
    for row in tracebacks:
        frames = row[1]
        size, count = row[3], row[4]
        assert isinstance(frames, tuple) and isinstance(size, int) and isinstance(count, int)
        stacks.append((tuple(_frame(f) for f in frames), size, count))
    return stacks


class FoldedStacks(NamedTuple):
    """Memory by stack kept small, for an agent to hold many: its biggest
    stacks (``FOLDED_STACKS``, within ``FOLDED_FRAMES`` frame references),
    biggest first, in flat arrays: stack i is the indexes into ``frames``
    ``ids[ends[i-1]:ends[i]]``, most recent first, and holds ``sizes[i]``
    bytes in ``counts[i]`` blocks."""

    frames: tuple[Frame, ...]
    ids: array[int]
    ends: array[int]
    sizes: array[int]
    counts: array[int]
    other: tuple[int, int]
    """The size and count of the stacks left out."""


def fold_stacks(
    tracebacks: Iterable[RawTracebackInfo], previous: FoldedStacks | None = None
) -> FoldedStacks:
    """The biggest stacks of ``Snapshot.tracebacks(names=True)`` rows,
    folded; frames equal to ``previous``'s are its own objects, so the
    readings an agent keeps share what they have in common."""
    rows = list(tracebacks)
    known = {frame: frame for frame in previous.frames} if previous is not None else {}
    index: dict[Frame, int] = {}
    frames: list[Frame] = []
    ids, ends, sizes, counts = array("I"), array("I"), array("q"), array("q")
    for _domain, raw, _total_nframe, size, count in heapq.nlargest(
        FOLDED_STACKS, rows, key=lambda row: row[3]
    ):
        if len(ids) + len(raw) > FOLDED_FRAMES:
            continue  # a deep one: what it holds goes with the rest
        for each in raw:
            frame = _frame(each)
            frame = known.setdefault(frame, frame)
            at = index.get(frame)
            if at is None:
                at = index[frame] = len(frames)
                frames.append(frame)
            ids.append(at)
        ends.append(len(ids))
        sizes.append(size)
        counts.append(count)
    other = (
        sum(row[3] for row in rows) - sum(sizes),
        sum(row[4] for row in rows) - sum(counts),
    )
    return FoldedStacks(tuple(frames), ids, ends, sizes, counts, other)


def unfold_stacks(folded: FoldedStacks) -> list[Stack]:
    """The stacks of a folded reading, what it left out as one
    ``(other stacks)`` frame, as ``view_data`` takes them."""
    frames, ids = folded.frames, folded.ids
    stacks: list[Stack] = []
    start = 0
    for end, size, count in zip(folded.ends, folded.sizes, folded.counts):
        stacks.append((tuple(frames[i] for i in ids[start:end]), size, count))
        start = end
    if folded.other[0] > 0:
        stacks.append((((OTHER_STACKS, 0, ""),), folded.other[0], folded.other[1]))
    return stacks


def _frame(frame: tuple[object, ...]) -> Frame:
    name = frame[2] if len(frame) > 2 else ""
    return (str(frame[0]), int(frame[1]) if isinstance(frame[1], int) else 0, str(name or ""))


def stacks_of_rows(
    rows: Iterable[RawStatistic], names: Mapping[tuple[str, int], str] | None = None
) -> list[Stack]:
    """Stacks of rows keyed by traceback, their functions named by ``names``."""
    known = names or {}
    return [
        (tuple((f, n, known.get((f, n), "")) for f, n in frames), size, count)
        for frames, size, count in rows
    ]


def function_names(rows: Iterable[RawStatistic]) -> dict[tuple[str, int], str]:
    """The function around each frame of ``rows`` whose source file is
    readable here (``heapwatch.formats.report``'s rules), by ``ast``: a dump
    keeps files and lines, not names."""
    wanted: dict[str, set[int]] = {}
    for frames, _size, _count in rows:
        for filename, lineno in frames:
            wanted.setdefault(filename, set()).add(lineno)
    names: dict[tuple[str, int], str] = {}
    for filename, lines in wanted.items():
        text = readable_source(filename)
        if not text:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        spans = _function_spans(tree)
        for lineno in lines:
            inside = [s for s in spans if s[0] <= lineno <= s[1]]
            names[(filename, lineno)] = max(inside)[2] if inside else "<module>"
    return names


def _function_spans(tree: ast.AST) -> list[tuple[int, int, str]]:
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    end = child.end_lineno or child.lineno
                    spans.append((child.lineno, end, name))
                    visit(child, name + ".<locals>.")
                else:
                    visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def median_age(histogram: Sequence[int]) -> int | None:
    """The fewest epochs of age at least half the bytes of an age histogram
    (the core's buckets: 0, then [2**(b-1), 2**b)) have; None when empty."""
    total = sum(histogram)
    if total <= 0:
        return None
    seen = 0
    for bucket in range(len(histogram) - 1, -1, -1):
        seen += histogram[bucket]
        if 2 * seen >= total:
            return 0 if bucket == 0 else 1 << (bucket - 1)
    return 0


class _Frames:
    """Frames interned: each distinct one sent once."""

    def __init__(self) -> None:
        self.ids: dict[Frame, int] = {}

    def encode(self, stacks: Sequence[Stack]) -> list[list[Any]]:
        kept = sorted(stacks, key=lambda s: s[1], reverse=True)
        rest = kept[MAX_STACKS:]
        out = [[self._ids(frames), size, count] for frames, size, count in kept[:MAX_STACKS]]
        if rest:
            other = ((OTHER_STACKS, 0, ""),)
            out.append([self._ids(other), sum(s[1] for s in rest), sum(s[2] for s in rest)])
        return out

    def _ids(self, frames: tuple[Frame, ...]) -> list[int]:
        ids = []
        for frame in reversed(frames):  # outermost first: the icicle's order
            index = self.ids.get(frame)
            if index is None:
                index = self.ids[frame] = len(self.ids)
            ids.append(index)
        return ids

    def table(self) -> list[list[Any]]:
        return [list(frame) for frame in self.ids]


def view_data(
    *,
    kind: str,
    stacks: Sequence[Stack],
    base: Sequence[Stack] | None = None,
    base_label: str = "",
    baselines: Sequence[Baseline] = (),
    sites: Sequence[SiteRow] = (),
    suspects: Sequence[SuspectRow] = (),
    timeline: Sequence[TimelineRow] = (),
    mode: str,
    sample_interval: int,
    total: tuple[int, int],
    peak: int | None = None,
    notes: Sequence[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The document the page and the report draw; ``kind`` is "live" or "dumps"."""
    frames = _Frames()
    encoded = frames.encode(stacks)
    encoded_base = None if base is None else frames.encode(base)
    encoded_baselines = [{"at": at, "stacks": frames.encode(old)} for at, old in baselines]
    return {
        "kind": kind,
        "mode": mode,
        "sample_interval": sample_interval if mode == "sample" else 0,
        "total": {"size": total[0], "count": total[1]},
        "peak": peak,
        "notes": list(notes),
        "meta": dict(meta or {}),
        "frames": frames.table(),
        "stacks": encoded,
        "base": None if encoded_base is None else {"label": base_label, "stacks": encoded_base},
        "baselines": encoded_baselines,
        "sites": [row._asdict() for row in sites],
        "suspects": [row._asdict() for row in suspects],
        "timeline": [list(row) for row in timeline],
    }


_SCRIPT_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def script_json(data: Any) -> str:
    """``data`` as JSON that cannot end or confuse the ``<script>`` element
    holding it: no ``<``, ``>`` or ``&`` appears as such (JSON reads the
    escapes back as the same characters)."""
    # Imported here: the agent imports this module for fold_stacks, and an
    # agent that serves nothing imports no json (test_agent_api).
    import json  # noqa: PLC0415 (see above)

    # ASCII only: a lone surrogate (a name that was not UTF-8) stays an escape.
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.translate(_SCRIPT_ESCAPES)
