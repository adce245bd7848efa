"""One line per distinct problem in the service's log, rate-limited.

heapwatch's expected troubles (a client that never finishes its request, a
collector that is down, a dump directory that cannot be written) reach the
host's log as one clear line each, never a traceback, through the
``heapwatch`` loggers, and a problem that repeats is not repeated: a key's
first report is logged, the next ones within ``window`` seconds are counted
and logged at DEBUG only, and the first report after the window says how many
were left out.  The traceback, when there is one, goes to DEBUG.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from heapwatch.runtime.forks import call_in_forked_child

__all__ = ["DEFAULT_WINDOW", "ProblemLog"]

DEFAULT_WINDOW = 60.0
# Distinct keys remembered; beyond that the oldest are forgotten (a key made
# from what clients send must not grow without bound).
_MAX_KEYS = 256


class ProblemLog:
    """Reports problems on ``logger``, at most one line per key and window.

    Args:
        logger: where the lines go.
        window: seconds during which a key's repeats are only counted.
        clock: a monotonic clock (tests give their own).
    """

    def __init__(
        self,
        logger: logging.Logger,
        window: float = DEFAULT_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.window = window
        self._clock = clock
        # Reentrant: a signal handler reports from the main thread, maybe
        # while that thread was reporting.
        self._lock = threading.RLock()  # guards _seen
        self._seen: dict[str, tuple[float, int]] = {}
        """key -> (when it was last logged, repeats left out since)."""
        call_in_forked_child(self.after_fork_in_child)

    def after_fork_in_child(self) -> None:
        """A lock another thread of the parent held is replaced."""
        self._lock = threading.RLock()

    def report(
        self,
        key: str,
        message: str,
        *args: Any,
        level: int = logging.WARNING,
        exc_info: Any = None,
    ) -> bool:
        """Logs ``message % args`` once per ``window`` for ``key``; True if
        it was logged at ``level`` (False: counted, and logged at DEBUG)."""
        now = self._clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.window:
                self._seen[key] = (last[0], last[1] + 1)
                shown = False
                left_out = 0
            else:
                self._seen.pop(key, None)
                if len(self._seen) >= _MAX_KEYS:
                    del self._seen[next(iter(self._seen))]
                self._seen[key] = (now, 0)
                shown = True
                left_out = last[1] if last is not None else 0
        if not shown:
            self.logger.debug(message, *args, exc_info=exc_info)
            return False
        if left_out:
            message += " (%d more like it since the last report)"
            args = (*args, left_out)
        self.logger.log(level, message, *args)
        if exc_info:
            self.logger.debug("the traceback of the above", exc_info=exc_info)
        return True
