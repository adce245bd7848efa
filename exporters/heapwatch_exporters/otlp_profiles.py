"""Pushes each cycle's memory as OpenTelemetry profiles
(``HEAPWATCH_EXPORTERS=...,otlp-profiles``).  The signal is alpha: opt-in.

The sender thread (``_push.py``, shared with ``pyroscope``) encodes each
cycle's snapshot as an ``ExportProfilesServiceRequest``
(``heapwatch.formats.otlp_profiles``: an ``inuse_space`` and an
``alloc_space`` profile sharing one dictionary, the metrics' resource) and
POSTs it over OTLP/HTTP in protobuf.

The standard variables, the profiles' own first:
``OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`` (the whole URL), else
``OTEL_EXPORTER_OTLP_ENDPOINT`` plus ``/v1development/profiles``;
``_HEADERS`` (``key=value,...``, values percent-decoded); ``_TIMEOUT`` in
seconds, as the Python SDK's metrics exporter in the same process reads it;
``_COMPRESSION``, ``gzip`` or ``none``.
"""

from __future__ import annotations

import gzip
import logging
import os
import time
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from heapwatch._version import __version__
from heapwatch.agent.config import AgentConfig, ConfigError
from heapwatch.formats.otlp_profiles import encode_profiles_request
from heapwatch.formats.pprof import go_heap_samples
from heapwatch.runtime.route_names import name_of
from heapwatch_exporters._push import TIMEOUT, ProfilePusher, Push
from heapwatch_exporters._resource import resource_attributes

if TYPE_CHECKING:
    from heapwatch._core import Snapshot

__all__ = ["DEFAULT_ENDPOINT", "PROFILES_PATH", "OtlpProfilesExporter", "otlp_settings"]

log = logging.getLogger("heapwatch.otlp_profiles")

PROFILES_PATH = "/v1development/profiles"
"""Appended to ``OTEL_EXPORTER_OTLP_ENDPOINT``, as the spec appends
``/v1/metrics``."""
DEFAULT_ENDPOINT = "http://localhost:4318" + PROFILES_PATH
"""OTLP/HTTP's default, without any endpoint variable."""
_COMPRESSIONS = ("gzip", "none")
# Go's and the SDKs' fastest level: the encoder runs in the service.
_GZIP_LEVEL = 1


class _Settings:
    __slots__ = ("compression", "endpoint", "headers", "timeout")

    def __init__(
        self, endpoint: str, headers: dict[str, str], timeout: float, compression: str
    ) -> None:
        self.endpoint = endpoint
        self.headers = headers
        self.timeout = timeout
        self.compression = compression


def _variable(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """The profiles' own variable, else the general one: (its name, value)."""
    for variable in (f"OTEL_EXPORTER_OTLP_PROFILES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = env.get(variable, "").strip()
        if value:
            return variable, value
    return None


def _endpoint(env: Mapping[str, str]) -> str:
    own = env.get("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "").strip()
    general = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if own:
        variable, url = "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", own
    elif general:
        variable, url = "OTEL_EXPORTER_OTLP_ENDPOINT", general.rstrip("/") + PROFILES_PATH
    else:
        return DEFAULT_ENDPOINT
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{variable}={(own or general)!r} is invalid: an http:// or https:// URL "
            "with a host, such as http://collector:4318"
        )
    return url


def _headers(env: Mapping[str, str]) -> dict[str, str]:
    found = _variable(env, "HEADERS")
    if found is None:
        return {}
    variable, text = found
    headers = {}
    for number, entry in enumerate(text.split(","), start=1):
        if not entry.strip():
            continue
        key, equals, value = entry.partition("=")
        key = urllib.parse.unquote(key).strip()
        # The value is a secret (a token): the error names the entry, not it.
        if not equals or not key or any(c in key for c in " :\r\n"):
            raise ConfigError(
                f"{variable} is invalid at entry {number}: key=value pairs separated "
                "by commas, values percent-encoded, such as authorization=Bearer%20abc"
            )
        value = urllib.parse.unquote(value).strip()
        if any(c in value for c in "\r\n"):
            raise ConfigError(f"{variable} is invalid at entry {number}: a line break in a value")
        headers[key] = value
    return headers


def _timeout(env: Mapping[str, str]) -> float:
    found = _variable(env, "TIMEOUT")
    if found is None:
        return TIMEOUT
    variable, text = found
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise ConfigError(
            f"{variable}={text!r} is invalid: seconds, above 0 and at most 3600, as the "
            "Python SDK reads it (such as 10)"
        )
    return seconds


def _compression(env: Mapping[str, str]) -> str:
    found = _variable(env, "COMPRESSION")
    if found is None:
        return "none"
    variable, text = found
    if text.lower() not in _COMPRESSIONS:
        raise ConfigError(f"{variable}={text!r} is invalid: gzip or none")
    return text.lower()


def otlp_settings(env: Mapping[str, str] | None = None) -> _Settings:
    """The exporter's settings from the OTLP variables (``os.environ``
    unless given); ConfigError names a variable that is wrong."""
    env = os.environ if env is None else env
    return _Settings(_endpoint(env), _headers(env), _timeout(env), _compression(env))


class OtlpProfilesExporter(ProfilePusher):
    """The ``otlp-profiles`` exporter (entry point ``heapwatch.exporters``)."""

    name = "otlp-profiles"
    receiver = "the OTLP profiles endpoint"

    def __init__(self, config: AgentConfig, env: Mapping[str, str] | None = None) -> None:
        settings = otlp_settings(env)
        headers = {**settings.headers, "Content-Type": "application/x-protobuf"}
        if settings.compression == "gzip":
            headers["Content-Encoding"] = "gzip"
        super().__init__(settings.endpoint, headers, log, settings.timeout)
        self._gzip = settings.compression == "gzip"
        self._resource: dict[str, object] | None = None

    @classmethod
    def from_config(cls, config: AgentConfig) -> OtlpProfilesExporter:
        return cls(config)

    def encode(self, snap: Snapshot, start: float, end: float) -> Push:
        if self._resource is None:  # read in the sender thread, once
            self._resource = resource_attributes()
        body = encode_profiles_request(
            go_heap_samples(snap, name_of),
            resource=self._resource,
            scope_version=__version__,
            mode=snap.mode,
            sample_interval=snap.sample_interval,
            time_nanos=int(end * 1e9) if end > 0 else time.time_ns(),
            duration_nanos=max(0, int((end - start) * 1e9)),
        )
        if self._gzip:
            body = gzip.compress(body, compresslevel=_GZIP_LEVEL, mtime=0)
        return self.url, body, {}

    def hint(self, code: int, body: str) -> str:
        if code == 404:
            return (
                " (is the profiles signal on? the Collector needs "
                "--feature-gates=service.profilesSupport)"
            )
        # OTLP answers a google.rpc.Status in protobuf: only text is shown.
        return super().hint(code, body if body.isprintable() else "")

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()
        self._resource = None  # the child's pid
