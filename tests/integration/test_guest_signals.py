"""The service's signal delivery stays its own: every thread heapwatch starts
(or has started: wsgiref's request threads, the exporters') blocks the
asynchronous signals, and leaves the synchronous ones deliverable."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

from support.agent_process import run_script

SYNCHRONOUS = {
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
    signal.SIGSYS,
}
# The kernel never lets these be blocked.
UNBLOCKABLE = {signal.SIGKILL, signal.SIGSTOP}

THREAD_MASKS = textwrap.dedent(
    """\
    import json, os, socket, sys, time, urllib.request

    import heapwatch

    exporters = ["prometheus"]
    try:
        import opentelemetry.sdk  # noqa: F401
        exporters.append("otlp")
    except ImportError:
        pass
    agent = heapwatch.start_agent(
        exporters=exporters, port=0, interval=0.1, token="t" * 32, dump_dir=sys.argv[1]
    )
    url = agent.metrics_url.rsplit("/", 1)[0]
    # A request thread kept busy by a client that never finishes its request
    idle = socket.create_connection(agent.address)
    idle.sendall(b"GET /metrics HTTP/1.0\\r\\n")
    auth = {"Authorization": "Bearer " + "t" * 32}
    for path in ("/metrics", "/debug/heapwatch/top"):
        request = urllib.request.Request(url + path, headers=auth)
        urllib.request.urlopen(request, timeout=10).read()
    os.kill(os.getpid(), __import__("signal").SIGUSR2)  # the dump thread at work
    time.sleep(0.5)
    masks = {}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == os.getpid():
            continue
        with open(f"/proc/self/task/{tid}/status") as status:
            fields = dict(line.split(":\\t", 1) for line in status if ":\\t" in line)
        masks[tid] = int(fields["SigBlk"], 16)
    print(json.dumps({"exporters": exporters, "masks": masks}))
    """
)


def blocked(mask: int) -> set[int]:
    return {signum for signum in signal.valid_signals() if mask >> (signum - 1) & 1}


def test_every_thread_heapwatch_starts_blocks_the_asynchronous_signals(tmp_path: Path) -> None:
    # Given a service with every exporter, the /debug/ routes and the dump signal,
    # a request in flight and one served, and a dump written
    done = run_script(THREAD_MASKS, str(tmp_path / "dumps"), cwd=tmp_path)
    report = json.loads(done.stdout)
    # Then each of the threads besides the main one (all heapwatch's)
    assert len(report["masks"]) >= 4, report  # agent, http, a request, dump (+ otlp)
    expected = {int(s) for s in signal.valid_signals()} - SYNCHRONOUS - UNBLOCKABLE
    for tid, mask in report["masks"].items():
        # blocks every asynchronous signal, and no synchronous one
        assert expected <= blocked(mask), (tid, sorted(expected - blocked(mask)))
        assert not SYNCHRONOUS & blocked(mask), (tid, sorted(SYNCHRONOUS & blocked(mask)))


SIGPENDING = textwrap.dedent(
    """\
    import os, signal, time

    import heapwatch

    heapwatch.start_agent(exporters="prometheus", port=0, interval=0.05, token="t" * 32)
    time.sleep(0.3)  # the agent cycles; its thread and the server's are up
    caught = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: caught.append(signum))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    os.kill(os.getpid(), signal.SIGUSR1)
    for _ in range(20):  # bytecodes and sleeps: time for a handler to run
        time.sleep(0.01)
    before = (list(caught), signal.SIGUSR1 in signal.sigpending())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    print(before[0], before[1], caught)
    """
)


def test_a_signal_the_main_thread_blocks_stays_pending_until_it_unblocks_it(
    tmp_path: Path,
) -> None:
    # Given a service whose main thread blocks SIGUSR1 (test_signal.test_sigpending)
    # When the process is sent SIGUSR1
    done = run_script(SIGPENDING, cwd=tmp_path)
    # Then it stays pending (no other thread takes it) and is handled once unblocked
    assert done.stdout.split("\n")[0] == "[] True [10]", done.stdout + done.stderr
