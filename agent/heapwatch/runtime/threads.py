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
    "is_ours",
    "join_thread",
    "outlive_nobody",
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


class _Thread(threading.Thread):
    def run(self) -> None:
        # Born blocked (start_thread), and made sure of here: a thread
        # started from a thread that unblocked something again.
        if ASYNCHRONOUS_SIGNALS:
            signal.pthread_sigmask(signal.SIG_BLOCK, ASYNCHRONOUS_SIGNALS)
        _set_thread_traced(False)
        try:
            super().run()
        except Exception as exc:
            # threading's excepthook would print the traceback on the
            # service's stderr: one line in heapwatch's log instead.
            _problems.report(
                f"thread:{self.name}:{type(exc).__name__}",
                "heapwatch thread %s ended on an error: %r",
                self.name,
                exc,
                level=logging.ERROR,
                exc_info=exc,
            )


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


def start_thread(
    target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()
) -> threading.Thread:
    """Starts a daemon thread running ``target(*args)`` with the asynchronous
    signals blocked."""
    thread = _Thread(target=target, args=args, name=name, daemon=True)
    with signals_blocked():
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
            # Whatever called threading.current_thread() here made it a
            # _DummyThread, which threading.enumerate() would list for good.
            ident = _thread.get_ident()
            if isinstance(threading._active.get(ident), threading._DummyThread):  # type: ignore[attr-defined]
                threading._active.pop(ident, None)  # type: ignore[attr-defined]

    with signals_blocked():
        _thread.start_new_thread(run, ())


def is_ours(thread: threading.Thread) -> bool:
    """Whether ``thread`` was started by ``start_thread``."""
    return isinstance(thread, _Thread)


def _others(me: threading.Thread) -> list[threading.Thread]:
    # Dummy threads (started outside threading, from C) cannot be joined,
    # nor known to end: they are not waited for.
    return [
        thread
        for thread in threading.enumerate()
        if thread is not me
        and not is_ours(thread)
        and not isinstance(thread, threading._DummyThread)
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


def join_thread(thread: threading.Thread, deadline: float) -> bool:
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
        me = threading.current_thread()
        while True:
            others = [thread for thread in _others(me) if _running(thread)]
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
        return self._thread is threading.current_thread() or join_thread(self._thread, deadline)

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
