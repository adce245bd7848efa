"""The agent adds no descriptor the service would see: none kept, and none
that comes and goes while the service starts (CPython's test_subprocess
test_close_fds and test_pass_fds list a child's descriptors as it starts,
while the agent's first cycle runs)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from agent_process import run_script

LOW = 256  # the numbers listed again and again

DESCRIPTORS = textwrap.dedent(
    f"""\
    import json, os, sys, time

    if sys.argv[1] == "agent":
        import heapwatch

        # (the first cycle at once, in the agent's thread; the next in 60 s)
        assert heapwatch.start_agent(exporters="none", interval=60) is not None
    at_start = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    # As fd_status.py does, while the agent's first cycle runs
    seen = set()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        for fd in range({LOW}):
            try:
                os.fstat(fd)
            except OSError:
                continue
            seen.add(fd)
    print(json.dumps({{"at_start": at_start, "seen": sorted(seen)}}))
    """
)


def test_a_service_starting_under_the_agent_sees_no_descriptor_of_it(tmp_path: Path) -> None:
    untraced = json.loads(run_script(DESCRIPTORS, "untraced", cwd=tmp_path).stdout)
    traced = json.loads(run_script(DESCRIPTORS, "agent", cwd=tmp_path).stdout)
    # (the listing's own descriptor is in at_start both ways)
    assert traced["at_start"] == untraced["at_start"]
    assert traced["seen"] == untraced["seen"], "a descriptor came and went"
