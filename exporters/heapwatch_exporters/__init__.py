"""heapwatch's exporters: its live-memory data in the formats other tools read.

Each format lives in its own submodule, which imports only what it needs, so
that importing this package never loads an optional dependency:

- :mod:`heapwatch_exporters.pprof`: gzip-compressed pprof ``profile.proto`` heap
  profiles for ``go tool pprof``, Pyroscope, Parca and Grafana (stdlib only).
- :mod:`heapwatch_exporters.prometheus`: the agent's Prometheus collector and
  the WSGI/ASGI apps that serve it (prometheus-client).
- :mod:`heapwatch_exporters.otel`: the agent's OpenTelemetry instruments
  (``heapwatch[otlp]``), and :mod:`heapwatch_exporters.otel_instrumentor`, the
  ``opentelemetry-instrument`` entry point.
"""

from heapwatch_exporters.pprof import HeapSample, decode_profile, encode_heap_profile

__all__ = [
    "HeapSample",
    "decode_profile",
    "encode_heap_profile",
]
