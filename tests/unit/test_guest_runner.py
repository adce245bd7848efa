"""tests/guest/run.py (``make guest``) tells a hang from a slow run: a run
that keeps printing is waited for, one that prints nothing for the stall
time, or outlives the limit, is a hang."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support.repo_scripts import load_script

guest = load_script(Path(__file__).resolve().parents[1] / "guest" / "run.py", "guest_run")


def wait(script: str, stall: float, limit: float) -> bool:
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=output)
        try:
            return guest._wait_while_printing(proc, output, guest.Watch(stall, limit))
        finally:
            proc.kill()
            proc.wait()


# Prints a line every 0.3 s for about 4.5 s, then ends.
SLOW_BUT_PRINTING = (
    "import time\nfor i in range(15):\n    print(i, flush=True)\n    time.sleep(0.3)\n"
)


def test_a_run_that_keeps_printing_past_the_stall_time_is_waited_for() -> None:
    assert wait(SLOW_BUT_PRINTING, stall=2.0, limit=60.0)


def test_a_run_that_prints_then_goes_silent_is_a_hang() -> None:
    script = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"
    assert not wait(script, stall=2.0, limit=60.0)


def test_a_run_that_prints_forever_is_a_hang_at_the_limit() -> None:
    assert not wait(SLOW_BUT_PRINTING, stall=2.0, limit=2.5)


@pytest.mark.parametrize("argv", [["--stall", "0"], ["--limit", "-1"], ["--stall", "nan"]])
def test_the_stall_and_the_limit_must_be_positive(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        guest.main(argv)
    assert exit.value.code == 2


def test_a_run_that_failed_once_shows_its_output_in_the_report() -> None:
    # (a rare crash is diagnosed from this, or not at all)
    runs = {
        "untraced": guest.Run("SUCCESS", 1.0),
        "exact": guest.Run("CRASH(120)", 2.0, tail="...\nOSError: [Errno 9] Bad file descriptor"),
    }
    flaky = guest.FileResult("test_subprocess", runs, flaky={"exact": "crash(120)"})
    report = guest.table([flaky], ["untraced", "exact"], "python3")
    assert report.endswith(
        "flaky once, not again: test_subprocess (exact): crash(120)\n"
        "```\n...\nOSError: [Errno 9] Bad file descriptor\n```\n"
    )
