"""Routes under real servers (issue 26): Flask under gunicorn (sync and
gthread workers), FastAPI under uvicorn, each started with
``opentelemetry-instrument`` as users start it, and again with heapwatch's
own middleware and no OpenTelemetry.  One route keeps memory, one churns;
concurrent clients interleave them.  The memory kept lands on the keeping
route within the sampling error, and the churning route holds none."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from _deploy_support import free_port, get_json, source_pythonpath, stop_process

from support.external_tools import require_tool
from support.waiting import wait_for

pytestmark = [pytest.mark.tools, pytest.mark.slow]

APPS = Path(__file__).parent / "routes_apps"
INTERVAL = 16 * 1024  # the mean sampling interval: a block is sampled with p ~ 0.98
REQUESTS = 24  # of each route
BLOCKS = 8  # per request
CLIENTS = 6

# (server, app module, keeping route's template, churning route's template)
FLASK = ("/keep/<int:n>", "/churn/<int:n>")
FASTAPI = ("/keep/{n}", "/churn/{n}")


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    if path.exists():
        return str(path)
    return shutil.which(name) or require_tool(name)


def _command(server: str, port: int) -> list[str]:
    if server == "uvicorn":
        return [
            _bin("uvicorn"),
            "fastapi_app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
        ]
    worker = ["-k", "sync"] if server == "gunicorn-sync" else ["-k", "gthread", "--threads", "4"]
    # One worker: the test asks the process that served every request.
    return [_bin("gunicorn"), *worker, "-w", "1", "-b", f"127.0.0.1:{port}", "flask_app:app"]


def _needs(server: str, otel: bool) -> None:
    if sys.version_info < (3, 10):
        # requirements-dev.txt installs the servers from 3.10 (it says why).
        pytest.skip("the route tests' servers are not installed on Python 3.9")
    modules = ["uvicorn", "fastapi"] if server == "uvicorn" else ["gunicorn", "flask"]
    if otel:
        modules += [
            "opentelemetry.sdk.trace",
            "opentelemetry.instrumentation.fastapi"
            if server == "uvicorn"
            else "opentelemetry.instrumentation.flask",
        ]
    for module in modules:
        if importlib.util.find_spec(module) is None:
            require_tool(module)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode())


def _serve(server: str, otel: bool, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HEAPWATCH_", "OTEL_", "PYTHONPATH"))
    }
    source_pythonpath(env, str(APPS))
    env.update(
        HEAPWATCH_MODE="sample",
        HEAPWATCH_SAMPLE_INTERVAL=str(INTERVAL),
        HEAPWATCH_INTERVAL="1",
        XDG_RUNTIME_DIR=str(tmp_path),  # gunicorn 23+'s control socket
    )
    command = _command(server, port)
    if otel:
        # As users start it: heapwatch's instrumentor starts the agent
        # (OpenTelemetry export only, into the API's no-op meter: nothing
        # leaves the host), the app sets up the SDK's TracerProvider.
        env.update(
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_SERVICE_NAME="routes-test",
            ROUTES_OTEL_SDK="1",
        )
        command = [_bin("opentelemetry-instrument"), *command]
    else:
        env.update(
            HEAPWATCH_ENABLED="1",
            HEAPWATCH_EXPORTERS="none",
            ROUTES_MIDDLEWARE="1",
        )
    log = tmp_path / "server.log"
    with open(log, "wb") as sink:
        # A session of its own: a worker the master leaves behind is killed too.
        proc = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=APPS,
            start_new_session=True,
        )
    wait_for(
        lambda: _truth(port) if proc.poll() is None else pytest.fail(log.read_text()),
        60.0,
        0.3,
        what=lambda: log.read_text(errors="replace"),
    )
    return proc, port, log


def _truth(port: int) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = get_json(f"http://127.0.0.1:{port}/truth")
        return found
    except OSError:
        return None


def _bound(blocks: int, block: int, interval: int) -> float:
    """Six standard deviations of the estimate of ``blocks`` sampled blocks:
    each is sampled with p = 1 - exp(-block/interval) and then weighs
    block/p, so the estimate's variance is blocks * block**2 * (1-p)/p."""
    p = 1 - math.exp(-block / interval)
    return 6 * math.sqrt(blocks * (1 - p) / p) * block


@pytest.mark.parametrize("otel", [True, False], ids=["opentelemetry", "middleware"])
@pytest.mark.parametrize("server", ["gunicorn-sync", "gunicorn-gthread", "uvicorn"])
def test_kept_memory_lands_on_its_route(server: str, otel: bool, tmp_path: Path) -> None:
    _needs(server, otel)
    keep_route, churn_route = FASTAPI if server == "uvicorn" else FLASK
    proc, port, log = _serve(server, otel, tmp_path)
    try:
        # The agent hooks the service's provider at its next cycle (1 s).
        before = wait_for(
            lambda: (t := _truth(port)) is not None and (t["otel_hooked"] or not otel) and t,
            30.0,
            0.2,
            what=lambda: log.read_text(errors="replace"),
        )
        assert before["mode"] == "sample", before
        assert before["interval"] == INTERVAL, before
        base = f"http://127.0.0.1:{port}"
        urls = [f"{base}/keep/{BLOCKS}", f"{base}/churn/{BLOCKS}"] * REQUESTS
        with ThreadPoolExecutor(CLIENTS) as clients:
            answers = list(clients.map(_get, urls))
        assert [a.strip('"') for a in answers].count("kept") == REQUESTS, answers[:4]
        after = _truth(port)
        assert after is not None
    finally:
        stop_process(proc, timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text

    routes: dict[str, int] = after["routes"]
    kept = after["kept"]
    assert kept == REQUESTS * BLOCKS
    truth = kept * after["block"]
    bound = _bound(kept, after["block"], INTERVAL)
    # The list that keeps the blocks grows under the route too: a few KiB.
    got = routes.get(keep_route, 0)
    assert abs(got - truth) <= bound, (routes, truth, bound)
    # The churning route freed every block it allocated: no live trace was
    # allocated where its blocks are.  What its requests leave behind are
    # small allocations (caches filled on first use), each sampled with
    # p ~ size/interval and then weighing about one interval: a handful of
    # intervals, far below the route's churn of truth bytes.
    assert after["churned_live"] == 0, after
    assert routes.get(churn_route, 0) <= truth / 16, (routes, truth)

    # Nothing of the kept blocks went to another label: what the others
    # (<none> holds the service's start) gained is far below a route's worth.
    def others(found: dict[str, int]) -> int:
        return sum(v for name, v in found.items() if name not in (keep_route, "/truth"))

    assert others(routes) - others(before["routes"]) < truth / 4, (before["routes"], routes)
