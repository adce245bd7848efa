"""The one sender loop of the profile pushers (``pyroscope.py``,
``otlp_profiles.py``).

Every cycle the agent keeps its snapshot (``retain_last_snapshot``); the
pusher's own thread, never the cycle, encodes it (the subclass's
``encode``) and POSTs it.  A receiver that is down, slow or refusing costs
the service nothing: the sender is heapwatch's own thread (signals blocked,
untraced), bodies wait in a bounded queue (the oldest is dropped when it is
full), a failed push backs off (doubling to ``MAX_BACKOFF``), and each
distinct failure is one rate-limited line on the pusher's logger.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from heapwatch.runtime.problems import ProblemLog
from heapwatch.runtime.threads import OwnThread, forget_dummy, join_thread, start_thread

if TYPE_CHECKING:
    from heapwatch._core import Snapshot
    from heapwatch.agent.interface import AgentView

__all__ = ["FIRST_BACKOFF", "MAX_BACKOFF", "QUEUE_LENGTH", "TIMEOUT", "ProfilePusher", "Push"]

QUEUE_LENGTH = 4
"""Bodies waiting for the receiver; the oldest goes when a fifth comes."""
TIMEOUT = 10.0
"""Seconds one push may take (connect, send, answer), unless the pusher's
settings say otherwise."""
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 300.0
"""Seconds between pushes after failures: doubling from FIRST_BACKOFF."""
_POLL = 0.5
"""Seconds between the sender's looks for a new cycle (the agent has no
per-cycle hook; a look is an attribute read)."""

Push = tuple[str, bytes, dict[str, str]]
"""One request: its URL, its body, and headers beside the pusher's own."""


class ProfilePusher:
    """A pusher's thread, queue and back-off; the subclass names itself
    (``name``, ``receiver``), encodes (``encode``) and may explain a refusal
    (``hint``)."""

    name = ""
    receiver = ""
    """What the failure lines call the receiver ("Pyroscope")."""
    pushes = False

    def __init__(
        self, url: str, headers: dict[str, str], log: logging.Logger, timeout: float = TIMEOUT
    ) -> None:
        self.url = url
        self._headers = headers
        self._timeout = timeout
        self._problems = ProblemLog(log)
        self._queue: collections.deque[Push] = collections.deque(maxlen=QUEUE_LENGTH)
        self._stop = threading.Event()
        self._thread: OwnThread | None = None
        self._agent: AgentView | None = None
        self._paused = False
        # The sender's state, kept across a pause for a fork: the cycle last
        # encoded and the back-off (only the sender thread changes them).
        self._last: float | None = None
        self._backoff = 0.0
        self._retry_at = 0.0
        self.sent = 0
        self.dropped = 0
        """Bodies the full queue let go (a receiver down for long)."""
        self.failed = 0
        """Pushes that failed (each one retried after a back-off)."""

    def encode(self, snap: Snapshot, start: float, end: float) -> Push:
        """The request of one snapshot covering ``start`` .. ``end``."""
        raise NotImplementedError

    def hint(self, code: int, body: str) -> str:
        """What a failure line adds to HTTP ``code`` answered with ``body``."""
        if code == 413:
            return " (the profile is larger than the receiver takes: raise its limit)"
        return f" ({body})" if body else ""

    def start(self, agent: AgentView) -> None:
        agent.retain_last_snapshot = True
        self._agent = agent
        self._stop = threading.Event()
        self._thread = start_thread(self._run, f"heapwatch-{self.name}", (agent, self._stop))

    def shutdown(self, timeout: float) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    def pause_for_fork(self, deadline: float) -> bool:
        """Ends the sender for a fork by the monotonic ``deadline`` (a push
        in flight is waited for until then): os.fork() warns of every thread
        it counts (docs/design/agent.md, "Fork")."""
        thread = self._thread
        if thread is None or thread.is_current():
            return thread is None
        self._paused = True
        self._stop.set()
        return join_thread(thread, deadline)

    def resume_after_fork(self) -> None:
        """Sends again, with the same queue and back-off, after a pause."""
        if not self._paused or self._agent is None:
            return
        self._paused = False
        # A thread that outlived the pause sees its own event set and returns.
        self._stop = threading.Event()
        self._thread = start_thread(self._run, f"heapwatch-{self.name}", (self._agent, self._stop))

    def after_fork_in_child(self) -> None:
        # The parent's thread is not the child's, nor its queue.
        self._thread = None
        self._paused = False
        self._queue.clear()
        self._stop = threading.Event()
        self._last = None
        self._backoff = self._retry_at = 0.0

    # ---- the sender thread ---------------------------------------------------

    def _run(self, agent: AgentView, stop: threading.Event) -> None:
        while not stop.wait(_POLL):
            forget_dummy()  # a record the last turn logged named this thread
            taken = agent.last_snapshot()
            if taken is not None and taken[1] != self._last:
                snap, when = taken
                start = when - agent.config.interval if self._last is None else self._last
                self._last = when
                push = self._encode_or_report(snap, start, when)
                del snap, taken  # the next cycle may let its tracebacks go
                if push is not None:
                    if len(self._queue) == self._queue.maxlen:
                        self.dropped += 1
                    self._queue.append(push)
            while self._queue and time.monotonic() >= self._retry_at and not stop.is_set():
                if self._push(*self._queue[0]):
                    self._queue.popleft()
                    self.sent += 1
                    self._backoff = 0.0
                else:
                    self.failed += 1
                    self._backoff = min(MAX_BACKOFF, max(FIRST_BACKOFF, self._backoff * 2))
                    self._retry_at = time.monotonic() + self._backoff
                    break

    def _encode_or_report(self, snap: Snapshot, start: float, end: float) -> Push | None:
        try:
            return self.encode(snap, start, end)
        except (ValueError, OverflowError, MemoryError) as exc:
            self._problems.report(
                f"encode:{type(exc).__name__}",
                "heapwatch cannot encode the profile for %s: %s; this cycle's is skipped",
                self.receiver,
                exc,
            )
            return None

    def _push(self, url: str, body: bytes, headers: dict[str, str]) -> bool:
        request = urllib.request.Request(
            url, data=body, headers={**self._headers, **headers}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                response.read()
            return True
        except urllib.error.HTTPError as exc:
            with exc:  # its response: left open, 3.14 warns when it is collected
                detail = self.hint(exc.code, _read_reason(exc))
            self._problems.report(
                f"http:{exc.code}",
                "heapwatch cannot push to %s at %s: HTTP %d%s; retrying with back-off",
                self.receiver,
                self.url,
                exc.code,
                detail,
            )
        except (OSError, ValueError) as exc:
            self._problems.report(
                f"error:{type(exc).__name__}",
                "heapwatch cannot push to %s at %s: %s; retrying with back-off",
                self.receiver,
                self.url,
                _short(exc),
            )
        return False


def _read_reason(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read(200).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _short(exc: BaseException) -> str:
    reason: Any = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc) or type(exc).__name__
