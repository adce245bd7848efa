"""Helpers of the deploy/ tests: a real Prometheus server (started on
127.0.0.1 with a generated configuration and a temporary TSDB, queried through
its HTTP API), free ports, and the environment that runs a program with the
heapwatch agent auto-started."""

from __future__ import annotations

import json
import os
import signal
import site
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def autostart_installed() -> bool:
    """Whether heapwatch is installed with its auto-start hook (make install);
    otherwise the tests run it from the source tree."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any((Path(d) / "heapwatch-autostart.pth").exists() for d in dirs)


def source_pythonpath(env: dict[str, str], *first: str) -> None:
    """Puts ``first`` on PYTHONPATH, and the source tree too when heapwatch is
    not installed (an installed heapwatch must not be shadowed by a checkout
    whose C extension may not be built)."""
    paths = list(first)
    if not autostart_installed():
        paths += [str(REPO / "agent"), str(REPO / "exporters")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read().decode())


def get_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text: str = response.read().decode()
        return text


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


class PrometheusError(AssertionError):
    pass


class Prometheus:
    """``with Prometheus(binary, config, workdir) as prom:`` runs the server
    until the block ends; ``prom.query(expr)`` returns the result list."""

    def __init__(self, binary: str, config: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(config, encoding="utf-8")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def __enter__(self) -> Prometheus:
        self._log = open(self.log_path, "wb")
        self._proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env={**os.environ, "HOME": str(self.workdir)},
        )
        try:
            self._wait_ready(30.0)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise PrometheusError(f"prometheus exited early:\n{self.log()}")
            try:
                get_text(self.url + "/-/ready", timeout=1.0)
                return
            except urllib.error.HTTPError as exc:  # 503 while it starts
                exc.close()  # 3.14+ warns of one left open (a ResourceWarning)
                time.sleep(0.2)
            except (OSError, urllib.error.URLError):
                time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready after {timeout}s:\n{self.log()}")

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            body = get_json(f"{self.url}/api/v1/{path}?{query}")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            exc.close()
            raise PrometheusError(f"{path} {params}: HTTP {exc.code}: {detail}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}"
        )
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets(self) -> dict[str, list[dict[str, Any]]]:
        data: dict[str, list[dict[str, Any]]] = self.api("targets", state="any")
        return data
