"""An agent that serves nothing and writes no dumps opens no file descriptor
in the service (CPython's test_subprocess counts a child's descriptors:
test_close_fds, test_pass_fds)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from agent_process import run_script

DESCRIPTORS = textwrap.dedent(
    """\
    import os, sys, time

    if sys.argv[1] == "agent":
        import heapwatch

        assert heapwatch.start_agent(exporters="none", interval=0.05) is not None
        time.sleep(0.2)  # cycles ran
    print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
    """
)


def test_an_agent_with_nothing_to_serve_opens_no_descriptor(tmp_path: Path) -> None:
    untraced = run_script(DESCRIPTORS, "untraced", cwd=tmp_path).stdout
    traced = run_script(DESCRIPTORS, "agent", cwd=tmp_path).stdout
    # (the listing's own descriptor is among both)
    assert traced == untraced
