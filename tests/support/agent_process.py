"""Helpers for tests that run Python subprocesses under the installed agent.

The auto-start ``.pth`` hook and the ``heapwatch`` command exist only in an
installed package (``make test`` installs it), so these tests run
``sys.executable`` without PYTHONPATH and skip when heapwatch is not
installed there (they fail instead under HEAPWATCH_REQUIRE_TOOLS=1).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from http.client import HTTPException
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def clean_env(**variables: str) -> dict[str, str]:
    """The test's environment without PYTHONPATH, HEAPWATCH_* or OTEL_*, plus ``variables``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "PYTHONPATH" and not key.startswith(("HEAPWATCH_", "OTEL_", "PROMETHEUS_"))
    }
    env.update(variables)
    return env


@functools.cache
def _installed() -> str:
    probe = (
        "import os, sysconfig, heapwatch, heapwatch_exporters\n"
        "pth = os.path.join(sysconfig.get_path('purelib'), 'heapwatch-autostart.pth')\n"
        "print(os.path.exists(pth), heapwatch.__file__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=clean_env(),
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        return "heapwatch is not installed in " + sys.executable
    found, _path = done.stdout.split(maxsplit=1)
    if found != "True":
        return "heapwatch-autostart.pth is not in site-packages of " + sys.executable
    return ""


def installed_python() -> str:
    """sys.executable, if heapwatch is installed there; else skip (or fail)."""
    reason = _installed()
    if reason:
        message = reason + " (make install, or make test)"
        if os.environ.get("HEAPWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return sys.executable


def installed_script(name: str) -> str:
    installed_python()
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    return str(path)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 right now."""
    for _ in range(200):
        base = random.randint(20000, 60000 - count)
        if all(_bindable(base + i) for i in range(count)):
            return base
    raise RuntimeError("no block of free ports")


def fetch(url: str, timeout: float = 5.0, headers: Mapping[str, str] | None = None) -> str | None:
    """The body of a GET, or None when nothing answers (yet) or the answer
    is cut short (the process ended meanwhile)."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body: bytes = response.read()
            return body.decode()
    except urllib.error.HTTPError as error:
        error.close()  # its body is a temporary file: 3.14 warns if it is left open
        return None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, HTTPException):
        return None


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def site_values(samples: Samples, name: str, file_suffix: str) -> dict[int, float]:
    """{line: value} of ``name`` for the sites whose file ends with ``file_suffix``."""
    out = {}
    for (sample, labels), value in samples.items():
        label = dict(labels)
        if sample == name and label.get("code_file_path", "").endswith(file_suffix):
            out[int(label["code_line_number"])] = value
    return out


@contextlib.contextmanager
def running(
    args: list[str], env: Mapping[str, str], cwd: str | os.PathLike[str] | None = None, **kw: Any
) -> Iterator[subprocess.Popen[str]]:
    """A subprocess with its output in files (``proc.output()`` reads them), killed at the end."""
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            args, env=dict(env), cwd=cwd, stdout=stdout, stderr=stderr, text=True, **kw
        )

        def output() -> tuple[str, str]:
            stdout.flush()
            stderr.flush()
            stdout.seek(0)
            stderr.seek(0)
            return stdout.read(), stderr.read()

        proc.output = output  # type: ignore[attr-defined]
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def python_path() -> str:
    """This test's heapwatch, for a child (installed or in the source tree)."""
    import heapwatch
    import heapwatch_exporters

    paths = {
        os.path.dirname(os.path.dirname(heapwatch.__file__)),
        os.path.dirname(os.path.dirname(heapwatch_exporters.__file__)),
    }
    return os.pathsep.join(sorted(paths))


def run_script(
    source: str,
    *args: str,
    cwd: str | os.PathLike[str],
    timeout: float = 60.0,
    check: bool = True,
    python_args: tuple[str, ...] = (),
    **variables: str,
) -> subprocess.CompletedProcess[str]:
    """Runs ``source`` in a fresh interpreter that imports this test's heapwatch,
    with ``variables`` added to a clean environment; fails on a non-zero
    status when ``check``."""
    script = Path(cwd) / "script.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, *python_args, str(script), *args],
        env=clean_env(PYTHONPATH=python_path(), **variables),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check:
        assert done.returncode == 0, f"status {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def with_default_sigint(args: list[str]) -> list[str]:
    """``args`` run with SIGINT at its default action, however the test run
    was started: a background job's children inherit SIGINT ignored, and a
    Python started so installs no KeyboardInterrupt handler (Ctrl-C would do
    nothing).  The wrapper runs no site (``-S``: no auto-start) and execs."""
    reset = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execvp(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-I", "-S", "-c", reset, *args]
