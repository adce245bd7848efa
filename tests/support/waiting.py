"""Waiting for something to happen: the one polling helper of the tests."""

from __future__ import annotations

import time
from typing import Callable, TypeVar, Union

T = TypeVar("T")

__all__ = ["wait_for"]


def wait_for(
    check: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    *,
    what: Union[str, Callable[[], str], None] = None,
) -> T:
    """Polls ``check`` until it returns something true, and returns that.

    Fails (AssertionError) after ``timeout`` seconds, saying ``what`` was
    awaited (a callable is asked at that moment: a log, the state seen).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {said or check}")
        time.sleep(interval)
