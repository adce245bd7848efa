"""heapwatch's threads end quietly: an error is one line in its log, never
threading's traceback on the service's stderr."""

from __future__ import annotations

import logging
import threading

import pytest

from heapwatch.runtime.threads import start_thread


def test_an_error_in_a_thread_of_ours_is_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    printed: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", printed.append)

    def fail() -> None:
        raise OSError(9, "Bad file descriptor")

    with caplog.at_level(logging.DEBUG, logger="heapwatch"):
        for _ in range(2):
            start_thread(fail, "heapwatch-test-fail").join()
    assert printed == []
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in errors] == [
        "heapwatch thread heapwatch-test-fail ended on an error: OSError(9, 'Bad file descriptor')"
    ]
    assert errors[0].exc_info is None  # the traceback only at DEBUG
