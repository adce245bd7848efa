"""heapwatch's exporters: its live-memory data in the formats other tools read.

Each format lives in its own submodule, which imports only what it needs, so
that importing this package never loads an optional dependency:

- :mod:`heapwatch_exporters.pprof`: gzip-compressed pprof ``profile.proto`` heap
  profiles for ``go tool pprof``, Pyroscope, Parca and Grafana (stdlib only).
"""

from heapwatch_exporters.pprof import HeapSample, decode_profile, encode_heap_profile

__all__ = [
    "HeapSample",
    "decode_profile",
    "encode_heap_profile",
]
