"""heapwatch's exporters: plug-ins that publish the agent's readings.

The agent finds them by name (``HEAPWATCH_EXPORTERS``) through the entry-point
group ``heapwatch.exporters``, and never imports them itself; each submodule
imports only what it needs, so importing this package never loads an
optional dependency:

- :mod:`heapwatch_exporters.prometheus`: the agent's Prometheus collector and
  the WSGI/ASGI apps that serve it (prometheus-client).
- :mod:`heapwatch_exporters.otel`: the agent's OpenTelemetry instruments
  (``heapwatch[otlp]``), and :mod:`heapwatch_exporters.otel_instrumentor`, the
  ``opentelemetry-instrument`` entry point.

pprof, a file format, lives in ``heapwatch.formats.pprof``; its names stay
importable from here and from ``heapwatch_exporters.pprof``.
"""

from heapwatch.formats.pprof import HeapSample, decode_profile, encode_heap_profile

__all__ = [
    "HeapSample",
    "decode_profile",
    "encode_heap_profile",
]
