"""Pushes each cycle's profile to Grafana Pyroscope (``HEAPWATCH_EXPORTERS=
...,pyroscope`` with ``HEAPWATCH_PYROSCOPE_URL``).

Every cycle the agent keeps its snapshot (``retain_last_snapshot``); this
exporter's own thread, never the cycle, encodes it as Go's heap profile
(``encode_go_heap_profile``: the four sample types) and POSTs it to
``<url>/ingest?name=<service>{labels}&format=pprof&from=..&until=..``. The
service name is the OpenTelemetry resource's ``service.name``
(``OTEL_SERVICE_NAME``), the labels the resource's other attributes
(``_resource.py``, the metrics' resource too).

A receiver that is down, slow or refusing costs the service nothing: the
sender is heapwatch's own thread (signals blocked, untraced), profiles wait
in a bounded queue (the oldest is dropped when it is full), a failed push
backs off (doubling to ``MAX_BACKOFF``), and each distinct failure is one
rate-limited line on the ``heapwatch.pyroscope`` logger.
"""

from __future__ import annotations

import base64
import collections
import logging
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

from heapwatch.agent.config import AgentConfig, ConfigError
from heapwatch.formats.pprof import encode_go_heap_profile
from heapwatch.runtime.problems import ProblemLog
from heapwatch.runtime.threads import start_thread
from heapwatch_exporters._resource import UNKNOWN_SERVICE, service_attributes

if TYPE_CHECKING:
    from heapwatch.agent.interface import AgentView

__all__ = ["MAX_BACKOFF", "QUEUE_LENGTH", "TIMEOUT", "PyroscopeExporter", "ingest_url"]

log = logging.getLogger("heapwatch.pyroscope")

QUEUE_LENGTH = 4
"""Profiles waiting for the receiver; the oldest goes when a fifth comes."""
TIMEOUT = 10.0
"""Seconds one push may take (connect, send, answer)."""
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 300.0
"""Seconds between pushes after failures: doubling from FIRST_BACKOFF."""
_POLL = 0.5
"""Seconds between the sender's looks for a new cycle (the agent has no
per-cycle hook; a look is an attribute read)."""
# Pyroscope's label names: Prometheus's.
_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _label_value(value: str) -> str:
    # The name parameter is name{k=v,...}: the separators cannot appear inside.
    return re.sub(r"[{},=\s]", "_", value)


def ingest_url(base: str, attributes: dict[str, str], start: float, end: float) -> str:
    """The ``/ingest`` URL of one profile covering ``start`` .. ``end``."""
    service = attributes.get("service.name", UNKNOWN_SERVICE)
    labels = ",".join(
        f"{_LABEL_NAME.sub('_', key)}={_label_value(value)}"
        for key, value in sorted(attributes.items())
        if key != "service.name"
    )
    query = urllib.parse.urlencode(
        {
            "name": f"{_label_value(service)}{{{labels}}}",
            "format": "pprof",
            "from": int(start),
            "until": max(int(start), int(end)),
            "spyName": "heapwatch",
        }
    )
    return f"{base}/ingest?{query}"


class PyroscopeExporter:
    """The ``pyroscope`` exporter (entry point ``heapwatch.exporters``)."""

    name = "pyroscope"
    pushes = False

    def __init__(self, config: AgentConfig) -> None:
        if config.pyroscope_url is None:
            raise ConfigError(
                "the pyroscope exporter needs HEAPWATCH_PYROSCOPE_URL, such as "
                "http://pyroscope:4040"
            )
        self.url = config.pyroscope_url
        self._headers = {"Content-Type": "application/octet-stream"}
        if config.pyroscope_user is not None or config.pyroscope_password is not None:
            pair = f"{config.pyroscope_user or ''}:{config.pyroscope_password or ''}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        if config.pyroscope_tenant_id is not None:
            self._headers["X-Scope-OrgID"] = config.pyroscope_tenant_id
        self._problems = ProblemLog(log)
        self._queue: collections.deque[tuple[str, bytes]] = collections.deque(maxlen=QUEUE_LENGTH)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.dropped = 0
        """Profiles the full queue let go (a receiver down for long)."""

    @classmethod
    def from_config(cls, config: AgentConfig) -> PyroscopeExporter:
        return cls(config)

    def start(self, agent: AgentView) -> None:
        agent.retain_last_snapshot = True
        self._stop = threading.Event()
        self._thread = start_thread(self._run, "heapwatch-pyroscope", (agent,))

    def shutdown(self, timeout: float) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    def after_fork_in_child(self) -> None:
        # The parent's thread is not the child's, nor its queue.
        self._thread = None
        self._queue.clear()
        self._stop = threading.Event()

    # ---- the sender thread ---------------------------------------------------

    def _run(self, agent: AgentView) -> None:
        attributes = service_attributes()
        comment = f"heapwatch pid {os.getpid()} on {socket.gethostname()}"
        last: float | None = None
        backoff = 0.0
        retry_at = 0.0
        stop = self._stop
        while not stop.wait(_POLL):
            taken = agent.last_snapshot()
            if taken is not None and taken[1] != last:
                snap, when = taken
                start = when - agent.config.interval if last is None else last
                last = when
                body = encode_go_heap_profile(
                    snap, default_sample_type="inuse_space", comments=[comment]
                )
                del snap, taken  # the next cycle may let its tracebacks go
                if len(self._queue) == self._queue.maxlen:
                    self.dropped += 1
                self._queue.append((ingest_url(self.url, attributes, start, when), body))
            while self._queue and time.monotonic() >= retry_at and not stop.is_set():
                url, body = self._queue[0]
                if self._push(url, body):
                    self._queue.popleft()
                    self.sent += 1
                    backoff = 0.0
                else:
                    backoff = min(MAX_BACKOFF, max(FIRST_BACKOFF, backoff * 2))
                    retry_at = time.monotonic() + backoff
                    break

    def _push(self, url: str, body: bytes) -> bool:
        request = urllib.request.Request(url, data=body, headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                response.read()
            return True
        except urllib.error.HTTPError as exc:
            with exc:  # its response: left open, 3.14 warns when it is collected
                detail = _reason(exc)
            self._problems.report(
                f"http:{exc.code}",
                "heapwatch cannot push to Pyroscope at %s: HTTP %d%s; retrying with back-off",
                self.url,
                exc.code,
                detail,
            )
        except (OSError, ValueError) as exc:
            self._problems.report(
                f"error:{type(exc).__name__}",
                "heapwatch cannot push to Pyroscope at %s: %s; retrying with back-off",
                self.url,
                _short(exc),
            )
        return False


def _reason(exc: urllib.error.HTTPError) -> str:
    if exc.code == 413:
        return " (the profile is larger than the receiver takes: raise its limit)"
    try:
        text = exc.read(200).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return f" ({text})" if text else ""


def _short(exc: BaseException) -> str:
    reason: Any = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc) or type(exc).__name__
