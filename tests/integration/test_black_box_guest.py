"""The black box's thread is a guest like every thread of ours: it blocks
the service's signals, keeps no process alive, and leaves a clean exit's
black boxes marked so that the next process does not report them."""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time
from pathlib import Path

from test_guest_signals import SYNCHRONOUS, UNBLOCKABLE, blocked

from support.agent_process import clean_env, installed_python
from support.memory_cgroups import child_memory_cgroup

SERVICE = textwrap.dedent(
    """\
    import json, os, sys, threading, time

    import heapwatch

    heapwatch.start_agent(exporters="none", interval=60, dump_dir=sys.argv[1], dump_at=sys.argv[2])
    time.sleep(0.5)  # a few polls; with a threshold of 1 byte, a black box
    from heapwatch.runtime.threads import own_threads  # (threading lists none of ours)
    names = {t.native_id: t.name for t in [*threading.enumerate(), *own_threads()]}
    masks = {}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == os.getpid():
            continue
        with open(f"/proc/self/task/{tid}/status") as status:
            fields = dict(line.split(":\\t", 1) for line in status if ":\\t" in line)
        masks[names.get(int(tid), tid)] = int(fields["SigBlk"], 16)
    print(json.dumps(masks), flush=True)
    # The end of the main thread ends the process: nothing of ours waits
    """
)


def test_the_black_box_thread_blocks_signals_and_a_clean_exit_marks_its_boxes(
    tmp_path: Path,
) -> None:
    python = installed_python()
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    dumps = tmp_path / "dumps"
    with child_memory_cgroup(4 << 30) as cgroup:
        args = cgroup.command(python, str(script), str(dumps), "1B")
        started = time.monotonic()
        done = subprocess.run(
            args,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    masks = json.loads(done.stdout)
    assert "heapwatch-black-box" in masks, masks
    expected = {int(s) for s in signal.valid_signals()} - SYNCHRONOUS - UNBLOCKABLE
    assert expected <= blocked(masks["heapwatch-black-box"])
    assert took < 30
    # The box written (a threshold of 1 byte: crossed at the first look) is
    # marked exited: the process ended cleanly, so a restart reports nothing
    (box,) = sorted(dumps.glob("*-blackbox.hwdump"))
    assert (dumps / f".{box.name}.exited").exists()
    assert "crossed 0.0 MiB (the memory limit is 4096.0 MiB)" in done.stderr
