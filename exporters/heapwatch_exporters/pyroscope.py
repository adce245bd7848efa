"""Pushes each cycle's profile to Grafana Pyroscope (``HEAPWATCH_EXPORTERS=
...,pyroscope`` with ``HEAPWATCH_PYROSCOPE_URL``).

The sender thread (``_push.py``, shared with ``otlp-profiles``) encodes each
cycle's snapshot as Go's heap profile (``encode_go_heap_profile``: the four
sample types) and POSTs it to
``<url>/ingest?name=<service>{labels}&format=pprof&from=..&until=..``. The
service name is the OpenTelemetry resource's ``service.name``
(``OTEL_SERVICE_NAME``), the labels the resource's other attributes
(``_resource.py``, the metrics' resource too).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import socket
import urllib.parse
from typing import TYPE_CHECKING

from heapwatch.agent.config import AgentConfig, ConfigError
from heapwatch.formats.pprof import encode_go_heap_profile
from heapwatch.runtime.route_names import name_of
from heapwatch_exporters._push import ProfilePusher, Push
from heapwatch_exporters._resource import UNKNOWN_SERVICE, service_attributes

if TYPE_CHECKING:
    from heapwatch._core import Snapshot

__all__ = ["PyroscopeExporter", "ingest_url"]

log = logging.getLogger("heapwatch.pyroscope")

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


class PyroscopeExporter(ProfilePusher):
    """The ``pyroscope`` exporter (entry point ``heapwatch.exporters``)."""

    name = "pyroscope"
    receiver = "Pyroscope"

    def __init__(self, config: AgentConfig) -> None:
        if config.pyroscope_url is None:
            raise ConfigError(
                "the pyroscope exporter needs HEAPWATCH_PYROSCOPE_URL, such as "
                "http://pyroscope:4040"
            )
        headers = {"Content-Type": "application/octet-stream"}
        if config.pyroscope_user is not None or config.pyroscope_password is not None:
            pair = f"{config.pyroscope_user or ''}:{config.pyroscope_password or ''}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        if config.pyroscope_tenant_id is not None:
            headers["X-Scope-OrgID"] = config.pyroscope_tenant_id
        super().__init__(config.pyroscope_url, headers, log)
        self._attributes: dict[str, str] | None = None
        self._comment = ""

    @classmethod
    def from_config(cls, config: AgentConfig) -> PyroscopeExporter:
        return cls(config)

    def encode(self, snap: Snapshot, start: float, end: float) -> Push:
        if self._attributes is None:  # read in the sender thread, once
            self._attributes = service_attributes()
            self._comment = f"heapwatch pid {os.getpid()} on {socket.gethostname()}"
        body = encode_go_heap_profile(
            snap, default_sample_type="inuse_space", comments=[self._comment], route_name=name_of
        )
        return ingest_url(self.url, self._attributes, start, end), body, {}

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()
        self._attributes = None  # the child's pid
