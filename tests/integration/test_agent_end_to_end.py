"""The installed agent end to end: Python processes started with HEAPWATCH_* only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support.agent_process import (
    clean_env,
    fetch,
    free_ports,
    installed_python,
    installed_script,
    parse,
    running,
    site_values,
)
from support.waiting import wait_for

LEAKY = """\
import time

leak = []


def grow():
    leak.append(bytearray(100_000))  # LEAK


while True:
    grow()
    time.sleep(0.05)
"""

# Prints what its own agent serves: no polling from the test, no port guessing.
SELF_SCRAPE = """\
import os, sys, time, urllib.error, urllib.request

port = os.environ.get("SCRAPE_PORT", os.environ.get("HEAPWATCH_PORT"))
url = "http://127.0.0.1:%s/metrics" % port
deadline = time.monotonic() + 30
while True:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
        if "heapwatch_traced_bytes" in body:
            break
    except urllib.error.HTTPError as exc:
        exc.close()  # its body is a temporary file: 3.14 warns if it is left open
        body = ""
    except OSError:
        body = ""
    if time.monotonic() > deadline:
        break
    time.sleep(0.05)
print("SERVED" if "heapwatch_traced_bytes" in body else "NOT SERVED")
print("INFO", [l for l in body.splitlines() if l.startswith("heapwatch_info")])
"""


def line_of(source: str, marker: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), 1) if marker in text)


def run_python(
    script: str, tmp_path: Path, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run(
        [installed_python(), str(path)],
        env=clean_env(**env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_script_that_does_not_import_heapwatch_shows_its_leak_growing(tmp_path: Path) -> None:
    # Given a leaking script that never imports heapwatch, started with the agent on
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY)
    leak_line = line_of(LEAKY, "# LEAK")
    port = free_ports()
    env = clean_env(HEAPWATCH_ENABLED="1", HEAPWATCH_PORT=str(port), HEAPWATCH_INTERVAL="0.2")
    url = f"http://127.0.0.1:{port}/metrics"
    with running([installed_python(), str(script)], env, cwd=tmp_path) as proc:
        # When /metrics is scraped
        def leak_size() -> float:
            text = fetch(url)
            if text is None:
                return 0.0
            return site_values(parse(text), "heapwatch_lineno_size_bytes", "leaky.py").get(
                leak_line, 0.0
            )

        first = wait_for(leak_size)
        # Then the leaking line is there, and grows
        wait_for(lambda: leak_size() > first + 1_000_000)
        samples = parse(wait_for(lambda: fetch(url)))
        assert proc.poll() is None
    info = {dict(labels)["mode"] for name, labels in samples if name == "heapwatch_info"}
    assert info == {"sample"}
    sizes = sum(v for (name, _), v in samples.items() if name == "heapwatch_lineno_size_bytes")
    assert sizes == samples["heapwatch_traced_bytes", ()]
    growth = site_values(samples, "heapwatch_lineno_growth_bytes", "leaky.py")
    assert growth[leak_line] > 0
    assert samples["heapwatch_sample_interval_bytes", ()] == 512 * 1024
    assert samples["process_resident_memory_bytes", ()] > 0


def test_openmetrics_is_served_when_asked_for(tmp_path: Path) -> None:
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY)
    port = free_ports()
    env = clean_env(HEAPWATCH_ENABLED="1", HEAPWATCH_PORT=str(port), HEAPWATCH_INTERVAL="0.2")
    url = f"http://127.0.0.1:{port}/metrics"
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
    with running([installed_python(), str(script)], env, cwd=tmp_path):
        text = wait_for(lambda: (t := fetch(url, headers=accept)) and "traced_bytes " in t and t)
    assert isinstance(text, str)
    assert text.endswith("# EOF\n")
    assert "# UNIT heapwatch_traced_bytes bytes" in text
    assert "# TYPE heapwatch_cycles counter" in text


def test_the_process_exits_promptly_with_the_agent_on(tmp_path: Path) -> None:
    started = time.monotonic()
    done = run_python(
        "print('done')\n",
        tmp_path,
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_PORT="0",
        HEAPWATCH_INTERVAL="3600",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    assert done.stderr == ""
    assert time.monotonic() - started < 15


def test_bad_values_warn_name_the_variable_and_the_service_runs(tmp_path: Path) -> None:
    port = free_ports()
    done = run_python(
        SELF_SCRAPE,
        tmp_path,
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_PORT=str(port),
        HEAPWATCH_INTERVAL="soon",
        HEAPWATCH_MODE="fast",
        HEAPWATCH_SAMPLE_INTERVAL="lots",
    )
    assert done.returncode == 0, done.stderr
    # The agent runs with the defaults
    assert "SERVED" in done.stdout.splitlines()
    assert 'mode="sample"' in done.stdout
    # and each bad value is named with what is accepted
    assert "HEAPWATCH_INTERVAL='soon' is invalid: expected a duration" in done.stderr
    assert "using 10.0" in done.stderr
    assert "HEAPWATCH_MODE='fast' is invalid: expected 'sample'" in done.stderr
    assert "HEAPWATCH_SAMPLE_INTERVAL='lots' is invalid" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_enabled_value_warns_and_leaves_heapwatch_off(tmp_path: Path) -> None:
    done = run_python(
        "import sys; print('heapwatch.agent.agent' in sys.modules)\n",
        tmp_path,
        HEAPWATCH_ENABLED="maybe",
    )
    assert done.returncode == 0
    assert done.stdout == "False\n"
    assert "HEAPWATCH_ENABLED='maybe' is invalid" in done.stderr
    assert "true/false, 1/0, yes/no or on/off" in done.stderr


@pytest.mark.parametrize("value", [None, "", "0", "false", " Off "])
def test_off_imports_nothing(tmp_path: Path, value: str | None) -> None:
    # Unset or a false word, the .pth line imports nothing at all.
    env = {} if value is None else {"HEAPWATCH_ENABLED": value}
    done = run_python(
        "import sys\n"
        "print(sorted(m for m in sys.modules if m.startswith(('heapwatch', 'prometheus'))))\n"
        "print('_heapwatch_pth' in sys.modules)\n"
        "print('threading' in sys.modules, 'logging' in sys.modules)\n",
        tmp_path,
        **env,
    )
    assert done.returncode == 0, done.stderr
    modules, hook, heavy = done.stdout.splitlines()
    assert modules == "[]"
    assert hook == "False"
    assert heavy == "False False"
    assert done.stderr == ""


@pytest.mark.parametrize("value", [None, "off"])
def test_the_pth_line_costs_well_under_a_millisecond_when_off(
    tmp_path: Path, value: str | None
) -> None:
    # The hook's whole cost when HEAPWATCH_ENABLED is unset or false is its one line.
    probe = textwrap.dedent(
        """\
        import os, sysconfig, time
        path = os.path.join(sysconfig.get_path("purelib"), "heapwatch-autostart.pth")
        line = open(path).read().strip()
        code = compile(line, path, "exec")
        runs = 10000
        start = time.perf_counter()
        for _ in range(runs):
            exec(code)
        print((time.perf_counter() - start) / runs)
        """
    )
    env = {} if value is None else {"HEAPWATCH_ENABLED": value}
    done = run_python(probe, tmp_path, **env)
    assert done.returncode == 0, done.stderr
    per_run = float(done.stdout)
    assert per_run < 1e-3, f"{per_run * 1e6:.1f} us"


CHILD = """\
import os, sys, time
child = []
child.append(bytearray(3_000_000))  # CHILD
print("child", os.getpid(), flush=True)
time.sleep(120)
"""

PARENT = """\
import os, subprocess, sys, time
parent = []
parent.append(bytearray(2_000_000))  # PARENT
proc = subprocess.Popen([sys.executable, sys.argv[1]])
time.sleep(120)
"""


def test_child_processes_get_their_own_endpoint(tmp_path: Path) -> None:
    # Given a service whose process starts another Python process
    (tmp_path / "parent.py").write_text(PARENT)
    (tmp_path / "child.py").write_text(CHILD)
    base = free_ports(3)
    env = clean_env(
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_MODE="exact",
        HEAPWATCH_PORT=str(base),
        HEAPWATCH_PORT_RANGE="3",
        HEAPWATCH_INTERVAL="0.2",
    )
    args = [installed_python(), str(tmp_path / "parent.py"), str(tmp_path / "child.py")]
    with running(args, env, cwd=tmp_path, start_new_session=True) as proc:
        try:
            # Then each process serves its own memory on the next port of the range
            def sites(port: int, name: str) -> dict[int, float]:
                text = fetch(f"http://127.0.0.1:{port}/metrics")
                if text is None:
                    return {}
                return site_values(parse(text), "heapwatch_lineno_size_bytes", name)

            parent_sites = wait_for(lambda: sites(base, "parent.py"))
            child_sites = wait_for(lambda: sites(base + 1, "child.py"))
            assert parent_sites[line_of(PARENT, "# PARENT")] >= 2_000_000
            assert child_sites[line_of(CHILD, "# CHILD")] >= 3_000_000
            assert sites(base, "child.py") == {}
            assert sites(base + 1, "parent.py") == {}
            assert fetch(f"http://127.0.0.1:{base + 2}/metrics") is None
        finally:
            os.killpg(proc.pid, 9)


def test_heapwatch_run_starts_the_agent_in_the_command(tmp_path: Path) -> None:
    heapwatch = installed_script("heapwatch")
    script = tmp_path / "scrape.py"
    script.write_text(SELF_SCRAPE)
    for launcher in ([heapwatch], [installed_python(), "-m", "heapwatch"]):
        port = free_ports()
        done = subprocess.run(
            [
                *launcher,
                "run",
                "--port",
                str(port),
                "--port-range",
                "1",
                "--interval",
                "200ms",
                "--mode",
                "exact",
                "--",
                installed_python(),
                str(script),
            ],
            env=clean_env(SCRAPE_PORT=str(port)),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "SERVED" in done.stdout.splitlines(), done.stderr
        assert 'mode="exact"' in done.stdout


def test_heapwatch_run_reports_bad_usage(tmp_path: Path) -> None:
    heapwatch = installed_script("heapwatch")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [heapwatch, *args],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    no_command = run("run")
    assert no_command.returncode == 2
    assert "COMMAND to run is required" in no_command.stderr
    bad = run("run", "--interval", "soon", "--", sys.executable, "-c", "pass")
    assert bad.returncode == 2
    assert "expected a duration" in bad.stderr
    missing = run("run", "--", "no-such-command-heapwatch")
    assert missing.returncode == 127
    assert "command not found" in missing.stderr
    assert run("--version").stdout.startswith("heapwatch ")
    assert "run" in run("--help").stdout


def test_the_agent_adds_nothing_to_the_environment(tmp_path: Path) -> None:
    # The agent adds no variable to the process's environment (children see
    # exactly what the parent was given).
    done = run_python(
        "import os; print(sorted(k for k in os.environ if k.startswith('HEAPWATCH')))\n",
        tmp_path,
        HEAPWATCH_ENABLED="1",
        HEAPWATCH_PORT="0",
    )
    assert done.stdout == "['HEAPWATCH_ENABLED', 'HEAPWATCH_PORT']\n"
    assert os.environ.get("HEAPWATCH_ENABLED") is None


SHORT_THREADS = """\
import threading
from heapwatch import _core

_core.start(1, "sample", 65536)
keep = []


def handle_one_request():
    keep.append(bytes(4096))


for _ in range(2000):
    thread = threading.Thread(target=handle_one_request)
    thread.start()
    thread.join()
snapshot = _core.take_snapshot(traces=False)
print(snapshot.traced / (2000 * 4096))
"""


def test_a_leak_in_short_lived_threads_is_estimated_in_sample_mode(tmp_path: Path) -> None:
    # Given a server that handles each request in a new thread, leaking 4 KiB each
    done = run_python(SHORT_THREADS, tmp_path)
    assert done.returncode == 0, done.stderr
    # Then the sampled estimate is near the truth (about 125 samples: within 2x)
    ratio = float(done.stdout)
    assert 0.5 < ratio < 2.0, ratio
