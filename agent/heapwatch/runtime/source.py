"""Where the agent's and the dump service's snapshots come from.

``CoreSource`` is the one adapter over ``heapwatch._core``: the agent's cycle
takes snapshots that reset the peak, with every trace (the ages of the leak
score are counted over the traces) and a new epoch when the agent says; the dump
service takes snapshots with every trace that leave the peak alone.  Tests give a model
instead (``SnapshotSource``).
"""

from __future__ import annotations

from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, overload

if TYPE_CHECKING:
    from heapwatch import _core

__all__ = ["CoreSource", "SnapshotLike", "SnapshotSource"]


class SnapshotLike(Protocol):
    @property
    def traced(self) -> int: ...
    @property
    def peak(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    def group(self, key_type: _core.KeyType, *, ages: bool = False) -> _core.GroupsLike: ...
    @overload
    def tracebacks(
        self, names: bool = False, peaks: Literal[False] = False, allocs: Literal[False] = False
    ) -> list[_core.RawTracebackInfo]: ...
    @overload
    def tracebacks(
        self, names: bool = False, peaks: bool = False, *, allocs: Literal[True]
    ) -> list[_core.RawTracebackAllocInfo]: ...
    @property
    def allocs_folded(self) -> tuple[int, int, int]: ...


class SnapshotSource(Protocol):
    """Where snapshots come from: the C core, or a model in tests."""

    def start(self, nframe: int, mode: str, sample_interval: int) -> bool:
        """Starts tracing; False if it was already tracing (it then keeps its
        own configuration and is not stopped with the agent)."""

    def stop(self) -> None: ...
    def configuration(self) -> tuple[str, int]:
        """(mode, sample_interval) in force."""

    def take_snapshot(self) -> SnapshotLike:
        """A snapshot that ``group(ages=True)`` can histogram by age; resets
        the peak atomically with it."""

    def current_epoch(self) -> int:
        """The epoch traces are recorded in now (0: the first since tracing
        started)."""

    def next_epoch(self) -> None:
        """Traces recorded from now on are one epoch younger."""

    def reset_peak(self) -> None: ...
    def snapshot(self, traces: bool) -> Any:
        """A snapshot of the tracer now that leaves the peak alone."""

    def tracer_memory(self) -> int: ...
    def dropped(self) -> int: ...
    def drain(self) -> None: ...
    def wake_after(self, delay: float, callback: Callable[[], object]) -> bool:
        """Arranges ``callback()`` from the main thread at a safe point once
        the process allocates ``delay`` seconds or more from now, replacing
        the last; False when it cannot (nothing allocates through it)."""

    def cancel_wake(self) -> None:
        """Forgets what ``wake_after`` arranged."""

    def call_soon(self, callback: Callable[[], object], frame: FrameType | None) -> bool:
        """Arranges ``callback()`` from the main thread at its next safe
        point (of ``frame``, when given); False when it cannot."""


class CoreSource:
    """``heapwatch._core``, the C tracer."""

    def __init__(self) -> None:
        from heapwatch import _core  # noqa: PLC0415 (the C core: only when used)

        self._core = _core

    def start(self, nframe: int, mode: str, sample_interval: int) -> bool:
        if self._core.is_tracing():
            return False
        # The agent's profile: the core records what the agent exports, not
        # the stdlib's whole depth and free-list re-stamps (core.md, "Profiles").
        self._core.start(nframe, mode, sample_interval, profile="agent")  # type: ignore[arg-type]
        return True

    def stop(self) -> None:
        self._core.stop()

    def configuration(self) -> tuple[str, int]:
        config = self._core.get_config()
        return config["mode"], config["sample_interval"]

    def take_snapshot(self) -> SnapshotLike:
        # With traces: ages are counted over them (the tracebacks alone do
        # not know how old their bytes are).
        return self._core.take_snapshot(traces=True, reset_peak=True)

    def current_epoch(self) -> int:
        return self._core.get_epoch()

    def next_epoch(self) -> None:
        # From the core's own epoch, never the agent's count: it never moves
        # back, and a restarted or forked agent carries on from it.
        self._core.set_epoch(self._core.get_epoch() + 1)

    def reset_peak(self) -> None:
        self._core.reset_peak()

    def tracer_memory(self) -> int:
        return self._core.get_tracemalloc_memory()

    def dropped(self) -> int:
        return self._core.get_stats()["dropped"]

    def drain(self) -> None:
        self._core.drain()

    def wake_after(self, delay: float, callback: Callable[[], object]) -> bool:
        # The hooks notice the deadline: without them in the allocator chain
        # nothing would.
        if not self._core.hooks_installed():
            return False
        self._core.wake_after(delay, callback)
        return True

    def cancel_wake(self) -> None:
        self._core.wake_cancel()

    def call_soon(self, callback: Callable[[], object], frame: FrameType | None) -> bool:
        self._core.call_soon(callback, frame)
        return True

    def snapshot(self, traces: bool) -> _core.Snapshot:
        """A snapshot of the tracer now (with every trace if ``traces``) that
        leaves the peak alone (the peak is the agent cycle's to reset);
        raises RuntimeError when nothing is being traced."""
        return self._core.take_snapshot(traces=traces, reset_peak=False)
