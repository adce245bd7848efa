"""One line per distinct problem, rate-limited (heapwatch.runtime.problems)."""

from __future__ import annotations

import logging

import pytest

from heapwatch.runtime.problems import ProblemLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_a_problem_is_logged_once_per_window_then_with_the_count_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    problems = ProblemLog(logging.getLogger("heapwatch.test"), window=60.0, clock=clock)
    caplog.set_level(logging.DEBUG, "heapwatch.test")
    # Given a problem reported three times within a minute
    assert problems.report("timeout", "client %s timed out", "a") is True
    clock.now += 10
    assert problems.report("timeout", "client %s timed out", "b") is False
    assert problems.report("timeout", "client %s timed out", "c") is False
    # Then one line shows; the repeats are at DEBUG only
    assert lines(caplog) == ["client a timed out"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG] == [
        "client b timed out",
        "client c timed out",
    ]
    # and after the window the next one shows, saying how many were left out
    clock.now += 60
    assert problems.report("timeout", "client %s timed out", "d") is True
    assert lines(caplog)[-1] == "client d timed out (2 more like it since the last report)"


def test_distinct_problems_each_get_their_line(caplog: pytest.LogCaptureFixture) -> None:
    problems = ProblemLog(logging.getLogger("heapwatch.test"), clock=Clock())
    caplog.set_level(logging.DEBUG, "heapwatch.test")
    problems.report("a", "first")
    problems.report("b", "second", level=logging.ERROR)
    problems.report("a", "first again")
    assert lines(caplog) == ["first", "second"]
    assert caplog.records[1].levelno == logging.ERROR


def test_a_traceback_goes_to_debug_never_to_the_line(caplog: pytest.LogCaptureFixture) -> None:
    problems = ProblemLog(logging.getLogger("heapwatch.test"), clock=Clock())
    caplog.set_level(logging.DEBUG, "heapwatch.test")
    try:
        raise OSError(28, "No space left on device")
    except OSError as exc:
        problems.report("dump", "no dump: %s", exc, exc_info=True)
    shown = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in shown] == ["no dump: [Errno 28] No space left on device"]
    assert shown[0].exc_info is None
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.DEBUG)


def test_remembered_keys_are_bounded() -> None:
    clock = Clock()
    problems = ProblemLog(logging.getLogger("heapwatch.test"), clock=clock)
    for index in range(1000):
        problems.report(f"key {index}", "problem")
    assert len(problems._seen) <= 256
