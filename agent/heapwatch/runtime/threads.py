"""Threads heapwatch starts: daemons that leave the service's signals alone.

A process-directed signal (``kill PID``) goes to any thread that does not
block it.  A service that blocks a signal in its main thread (to take it
later with ``sigwait`` or ``sigpending``, as ``test_signal.test_sigpending``
does) would otherwise have it taken by one of heapwatch's threads, and its
handler run at the wrong moment.  So every thread heapwatch starts blocks
every asynchronous signal, and so does every thread started from one of them
(a thread inherits its creator's mask: wsgiref's request threads, the
exporters' own).  The synchronous ones (faults raised by the thread itself)
stay deliverable, so that a crash in our thread is reported as one, by
faulthandler too.  SIGPIPE is blocked: a client that closes its connection
gives EPIPE, never a signal, whatever the service did with SIGPIPE.

What those threads allocate is heapwatch's own memory, not the service's:
the core does not record it (``_core.set_thread_traced``), and ``own_work``
does the same for heapwatch's work run from a thread of the service (a
cycle asked for through the API).  A dump's snapshot turned into tuples
(tens of MB for a service with ten thousand tracebacks), the leak tracker's
history, a /top report: none is shown as the service's memory, nor costs
the tracer a trace.  What they free of the service's is untracked as ever.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable, TypeVar, cast

from heapwatch.runtime.problems import ProblemLog

__all__ = [
    "ASYNCHRONOUS_SIGNALS",
    "SYNCHRONOUS_SIGNALS",
    "Lifeline",
    "OwnThread",
    "forget_dummy",
    "in_own_thread",
    "join_thread",
    "outlive_nobody",
    "own_threads",
    "own_work",
    "owned",
    "run_detached",
    "signals_blocked",
    "start_thread",
]

SYNCHRONOUS_SIGNALS: frozenset[int] = frozenset(
    int(getattr(signal, name))
    for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS")
    if hasattr(signal, name)
)
ASYNCHRONOUS_SIGNALS: frozenset[int] = (
    frozenset(int(s) for s in signal.valid_signals()) - SYNCHRONOUS_SIGNALS
    if hasattr(signal, "pthread_sigmask")
    else frozenset()
)


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """Blocks the asynchronous signals in the calling thread, and restores its
    mask after: threads created meanwhile (by us or by code we call) are
    born with them blocked, with no moment where a signal could reach them."""
    if not ASYNCHRONOUS_SIGNALS:
        yield
        return
    # pthread_sigmask() runs pending Python handlers after changing the mask,
    # and one that raises loses the previous mask: read it first, unchanged.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, ASYNCHRONOUS_SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


_problems = ProblemLog(logging.getLogger("heapwatch.agent"))


class OwnThread:
    """A thread of heapwatch's: a daemon started with ``_thread``, which
    ``threading`` never lists.

    A service that counts its threads (``threading.active_count() == 1``
    after a fork, as CPython's test_os does; a test suite's check for threads
    left behind; ``threading.enumerate()`` to join them all) sees its own
    alone.  The OS still shows ours (``/proc``, ``sys._current_frames()``,
    faulthandler): only ``threading``'s view is the service's.

    Whatever calls ``threading.current_thread()`` in such a thread (logging,
    when it names a record's thread) makes threading a ``_DummyThread`` for
    it, which it would list; ``forget_dummy`` drops it, at the end of each
    turn of our threads' loops and as the thread ends."""

    daemon = True
    """Never waited for at exit: the agent ends its threads itself."""

    def __init__(self, target: Callable[..., Any], name: str, args: tuple[Any, ...]) -> None:
        self.name = name
        self.ident: int | None = None
        self.native_id: int | None = None
        self._target = target
        self._args = args
        # Held while the thread runs: join() waits on it.
        self._running = _thread.allocate_lock()
        self._started = _thread.allocate_lock()

    def __repr__(self) -> str:
        return f"<heapwatch thread {self.name!r} {self.ident}>"

    def start(self) -> None:
        self._running.acquire()
        self._started.acquire()
        with signals_blocked():
            _thread.start_new_thread(self._bootstrap, ())
        # As threading.Thread.start(): its ident is known once this returns.
        self._started.acquire()
        self._started.release()

    def _bootstrap(self) -> None:
        try:
            self.ident = _thread.get_ident()
            self.native_id = _native_id()
            _OWN[self.ident] = self
            self._started.release()
            # Born blocked (signals_blocked in start), and made sure of here:
            # a thread started from a thread that unblocked something again.
            if ASYNCHRONOUS_SIGNALS:
                signal.pthread_sigmask(signal.SIG_BLOCK, ASYNCHRONOUS_SIGNALS)
            _set_os_name(self.name)
            _set_thread_traced(False)
            self._target(*self._args)
        except Exception as exc:
            # _thread would print the traceback on the service's stderr
            # ("Exception ignored in thread started by"): one line in
            # heapwatch's log instead.
            _problems.report(
                f"thread:{self.name}:{type(exc).__name__}",
                "heapwatch thread %s ended on an error: %r",
                self.name,
                exc,
                level=logging.ERROR,
                exc_info=exc,
            )
        finally:
            forget_dummy()
            # Released first: a fork in between leaves the child a handle
            # still in _OWN, which _after_fork_in_child settles.
            self._running.release()
            _OWN.pop(_thread.get_ident(), None)

    def _gone_in_fork(self) -> None:
        if self._running.locked():
            self._running.release()

    def is_alive(self) -> bool:
        return self._running.locked()

    def is_current(self) -> bool:
        """Whether the calling thread is this one."""
        return self.ident == _thread.get_ident()

    def join(self, timeout: float | None = None) -> None:
        if self.is_current():
            raise RuntimeError(f"{self!r} cannot join itself")
        waited = self._running.acquire(True, -1 if timeout is None else max(0.0, timeout))
        if waited:
            self._running.release()


# The own threads running, by ident: written by each as it starts and ends
# (a dict's item set and pop are atomic under the GIL, and with it).
_OWN: dict[int, OwnThread] = {}


def _after_fork_in_child() -> None:
    # As threading does for its own (_after_fork): in a child only the
    # forking thread lives.  The others' handles say they ended (join()
    # returns at once), and their idents, which the child's next threads
    # may be given, are no longer ours.
    me = _thread.get_ident()
    for ident, thread in list(_OWN.items()):
        if ident != me:
            del _OWN[ident]
            thread._gone_in_fork()


if hasattr(os, "register_at_fork"):
    # At import: before any hook of an object that holds one of these
    # handles (after_in_child hooks run in the order registered).
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _native_id() -> int | None:
    get = getattr(_thread, "get_native_id", None)
    return None if get is None else int(get())


def _set_os_name(name: str) -> None:
    # threading names the OS thread from 3.14 (top -H, /proc/*/task/*/comm):
    # so do we, where _thread can.
    set_name = getattr(_thread, "set_name", None)
    if set_name is not None:
        with contextlib.suppress(Exception):
            set_name(name)


def forget_dummy() -> None:
    """In a thread of ours: drops the ``_DummyThread`` that a call of
    ``threading.current_thread()`` made for it, so that threading does not
    list it."""
    ident = _thread.get_ident()
    if isinstance(threading._active.get(ident), threading._DummyThread):  # type: ignore[attr-defined]
        threading._active.pop(ident, None)  # type: ignore[attr-defined]


def in_own_thread() -> bool:
    """Whether the calling thread is one of heapwatch's."""
    return _thread.get_ident() in _OWN


def own_threads() -> list[OwnThread]:
    """heapwatch's threads running now (threading does not list them)."""
    return list(_OWN.values())


def _set_thread_traced(traced: bool) -> bool:
    # The C core when used, as CoreSource imports it (see config's bounds).
    from heapwatch import _core  # noqa: PLC0415

    return _core.set_thread_traced(traced)


@contextlib.contextmanager
def own_work() -> Iterator[None]:
    """Runs the block as heapwatch's own work: the blocks the calling thread
    allocates meanwhile are not traced (its frees still are untracked)."""
    previous = _set_thread_traced(False)
    try:
        yield
    finally:
        _set_thread_traced(previous)


F = TypeVar("F", bound=Callable[..., Any])


def owned(function: F) -> F:
    """``function`` run as heapwatch's own work (``own_work``), whichever
    thread calls it: what it builds for heapwatch is not the service's."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        with own_work():
            return function(*args, **kwargs)

    return cast(F, run)


def start_thread(target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()) -> OwnThread:
    """Starts a thread of heapwatch's (``OwnThread``) running
    ``target(*args)`` with the asynchronous signals blocked."""
    thread = OwnThread(target, name, args)
    thread.start()
    return thread


def run_detached(target: Callable[[], None]) -> None:
    """Runs ``target()`` in a short-lived thread of its own, at once.

    For work asked for from the main thread between two bytecodes (a pending
    call, a signal's handler): the service may then hold any lock, its own
    or the stdlib's (concurrent.futures' _global_shutdown_lock, held in
    ThreadPoolExecutor.submit, was one), and work that takes the same lock
    in that thread waits for itself for ever.  In a thread of its own it
    waits until the service lets go.  The thread is started with _thread,
    which takes no lock of threading's; ``target`` must not raise."""

    def run() -> None:
        if ASYNCHRONOUS_SIGNALS:
            signal.pthread_sigmask(signal.SIG_BLOCK, ASYNCHRONOUS_SIGNALS)
        _set_thread_traced(False)
        try:
            target()
        finally:
            forget_dummy()

    with signals_blocked():
        _thread.start_new_thread(run, ())


def _others() -> list[threading.Thread]:
    # threading lists none of ours.  Dummy threads (started outside
    # threading, from C) cannot be joined, nor known to end: they are not
    # waited for.
    return [
        thread for thread in threading.enumerate() if not isinstance(thread, threading._DummyThread)
    ]


# How often the lifeline looks for the application's threads: only in a
# child forked from a thread other than the main one.
_POLL_SECONDS = 0.1


def _running(thread: threading.Thread) -> bool:
    """Whether the OS thread behind ``thread`` still runs.  From 3.14 the
    thread a child was forked from, its main thread, stays alive for
    threading (join() waits for interpreter shutdown) once it has returned;
    the kernel knows better: the thread is gone, or a zombie while it leads
    a process that has threads left."""
    if not thread.is_alive():
        return False
    native_id = thread.native_id
    if native_id is None:
        return True
    from heapwatch import _core  # noqa: PLC0415

    try:
        # (by the core: see procmem._resident)
        stat = _core.read_small_file(f"/proc/self/task/{native_id}/stat")
        state = stat.rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return not os.path.isdir("/proc/self/task")  # no /proc: trust threading
    return state not in (b"Z", b"X")


def join_thread(thread: OwnThread, deadline: float) -> bool:
    """Joins ``thread`` until the monotonic ``deadline``, and then waits
    for its OS thread to be gone too; whether it is.  On 3.12 ``join()``
    returns once the thread's state is cleared, a little before the OS
    thread exits, and ``os.fork()`` counts the OS threads
    (/proc/self/stat) to warn that the process is multi-threaded; 3.13+
    joins the OS thread itself."""
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        return False
    native_id = thread.native_id
    if native_id is None:
        return True
    task = f"/proc/self/task/{native_id}"
    while os.path.exists(task):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_EXIT_POLL_SECONDS)
    return True


# How long join_thread sleeps between two looks at a joined thread's OS
# thread: it is gone within microseconds.
_EXIT_POLL_SECONDS = 0.00005


class Lifeline:
    """Calls ``then`` (which must end heapwatch's threads) from a thread of
    its own, ``heapwatch-lifeline``, once every thread of the application's
    has ended.

    For a process that ends when its last thread ends rather than when its
    main thread returns from ``main()``: a child forked from a thread other
    than the main one (a plain thread exit ends it, not ``exit()``).
    ``pause`` and ``resume`` step it out of the way of a fork."""

    def __init__(self, then: Callable[[], object]) -> None:
        self._then = then
        self._paused = threading.Event()
        self._thread = start_thread(self._watch, "heapwatch-lifeline", (self._paused,))

    def _watch(self, paused: threading.Event) -> None:
        while True:
            others = [thread for thread in _others() if _running(thread)]
            if not others:
                break
            # Polled, not joined: on 3.14 joining the child's main thread (the
            # forking one) waits past its timeout, for interpreter shutdown.
            if paused.wait(_POLL_SECONDS):
                return
        self._then()

    def pause(self, deadline: float) -> bool:
        """Ends the thread (by the monotonic ``deadline``); whether it ended."""
        self._paused.set()
        return self._thread.is_current() or join_thread(self._thread, deadline)

    def resume(self) -> None:
        """Watches again from a new thread, if ``pause`` ended the last one."""
        if not self._paused.is_set():
            return
        # A thread that outlived pause() sees its own event set and returns.
        self._paused = threading.Event()
        self._thread = start_thread(self._watch, "heapwatch-lifeline", (self._paused,))


def outlive_nobody(then: Callable[[], object]) -> Lifeline:
    """A ``Lifeline`` calling ``then`` once the application's threads ended."""
    return Lifeline(then)
