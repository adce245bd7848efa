"""heapwatch's threads are not the service's: threading never lists them,
and they end quietly (an error is one line in its log, never a traceback on
the service's stderr)."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import warnings

import pytest

from heapwatch.runtime.threads import OwnThread, own_threads, start_thread


def test_an_error_in_a_thread_of_ours_is_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    printed: list[object] = []
    monkeypatch.setattr(threading, "excepthook", printed.append)
    monkeypatch.setattr(sys, "unraisablehook", printed.append)

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


def test_threading_lists_no_thread_of_ours() -> None:
    before = threading.enumerate()
    count = threading.active_count()
    go = threading.Event()
    thread = start_thread(go.wait, "heapwatch-test-hidden")
    try:
        assert thread.is_alive()
        assert thread in own_threads()
        assert threading.enumerate() == before
        assert threading.active_count() == count
        assert thread.ident in sys._current_frames()  # the OS's view keeps it
    finally:
        go.set()
        thread.join(5)
    assert not thread.is_alive()
    assert thread not in own_threads()


def test_a_record_logged_in_a_thread_of_ours_leaves_threading_no_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = threading.enumerate()

    def log() -> None:
        logging.getLogger("heapwatch.test").warning("said from our thread")

    with caplog.at_level(logging.DEBUG, logger="heapwatch"):
        thread = start_thread(log, "heapwatch-test-log")
        thread.join(5)
    # logging named the thread: threading made a _DummyThread for it
    assert all(r.threadName.startswith("Dummy-") for r in caplog.records), caplog.records
    assert [r.thread for r in caplog.records] == [thread.ident]
    assert threading.enumerate() == before


def test_a_thread_of_ours_cannot_join_itself() -> None:
    failures: list[BaseException] = []
    started: list[OwnThread] = []
    ready = threading.Event()

    def join_me() -> None:
        ready.wait(5)
        try:
            started[0].join(1)
        except RuntimeError as exc:
            failures.append(exc)

    me = start_thread(join_me, "heapwatch-test-self")
    started.append(me)
    ready.set()
    me.join(5)
    assert [str(f) for f in failures] == [f"{me!r} cannot join itself"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
def test_in_a_forked_child_a_thread_of_ours_from_the_parent_has_ended() -> None:
    go = threading.Event()
    thread = start_thread(go.wait, "heapwatch-test-forked")
    read, write = os.pipe()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: forked with a thread
            pid = os.fork()
        if pid == 0:  # the child: no thread but this one
            started = time.monotonic()
            thread.join(5)
            seen = {
                "alive": thread.is_alive(),
                "joined_in": time.monotonic() - started,
                "ours": [t.name for t in own_threads()],
            }
            os.write(write, json.dumps(seen).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            seen = json.loads(pipe.read())
        os.waitpid(pid, 0)
    finally:
        go.set()
        thread.join(5)
    assert seen["alive"] is False
    assert seen["joined_in"] < 1.0
    assert seen["ours"] == []
