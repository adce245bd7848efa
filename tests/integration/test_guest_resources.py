"""The agent adds no descriptor the service would see: none kept, none that
comes and goes while the service starts (CPython's test_subprocess
test_close_fds and test_pass_fds list a child's descriptors as it starts,
while the agent's first cycle runs), and none that takes a number the
service closed for a moment (test_subprocess closes 0, 1 or 2 around a
Popen, then dup2()s them back)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from support.agent_process import clean_env, fetch, python_path, run_script

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


# As CPython's test_subprocess does around a Popen: close a standard
# descriptor, then dup2() the saved one back onto its number, again and
# again, while the agent cycles every 50 ms (it reads /proc/self/statm) and
# the test scrapes its endpoint (an accept() each, and the process_* series'
# /proc files), until both have done it 20 times.
JUGGLER = textwrap.dedent(
    """\
    import json, os, select, sys, time

    import heapwatch

    agent = heapwatch.start_agent(exporters="prometheus", port=0, interval=0.05)
    assert agent is not None and agent.metrics_url is not None
    os.write(1, (agent.metrics_url + "\\n").encode())
    assert sys.stdin.readline() == "go\\n"
    identity = {fd: (os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (0, 1, 2)}
    rounds = seen = failed = lost = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not lost:
        fd = rounds % 3
        saved = os.dup(fd)
        os.close(fd)
        time.sleep(0.0002)  # as a Popen would: the GIL released
        try:
            os.fstat(fd)
            seen += 1  # a descriptor the service never opened
        except OSError:
            pass
        try:
            os.dup2(saved, fd)
        except OSError:  # EBUSY: an open() of ours was taking the number
            failed += 1
            os.dup2(saved, fd)
        os.close(saved)
        try:
            now = os.fstat(fd)
            lost += (now.st_dev, now.st_ino) != identity[fd]
        except OSError:
            lost += 1  # closed under the service
        rounds += 1
        # (the test's "stop": it has scraped enough)
        if rounds % 3 == 0 and agent.readings()[1] >= 20 and select.select([0], [], [], 0)[0]:
            break
    result = {"rounds": rounds, "seen": seen, "failed": failed, "lost": lost,
              "cycles": agent.readings()[1]}
    os.write(2, (json.dumps(result) + "\\n").encode())
    """
)


def test_a_service_juggling_its_standard_descriptors_keeps_them(tmp_path: Path) -> None:
    script = tmp_path / "juggler.py"
    script.write_text(JUGGLER)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=clean_env(PYTHONPATH=python_path()),
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    scrapes = 0
    try:
        assert proc.stdin is not None and proc.stdout is not None
        url = proc.stdout.readline().strip()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        while proc.poll() is None and scrapes < 20:
            scrapes += fetch(url, timeout=2.0) is not None
        with contextlib.suppress(BrokenPipeError):  # (it may have ended: see its result)
            proc.stdin.write("stop\n")
            proc.stdin.flush()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (proc.returncode, err)
    result = json.loads(err.splitlines()[-1])
    # Then every number the service closed was still free in its window,
    # took its dup2(), and kept its own file
    assert (result["seen"], result["failed"], result["lost"]) == (0, 0, 0), result
    # while the agent cycled and answered scrapes meanwhile
    assert result["cycles"] >= 20, result
    assert scrapes >= 20, (scrapes, result)
