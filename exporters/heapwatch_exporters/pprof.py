"""pprof heap profiles under the name they were first published as.

pprof is a file format, so it lives with heapwatch's formats
(``heapwatch.formats.pprof``); this module keeps
``from heapwatch_exporters.pprof import ...`` working.
"""

from heapwatch.formats.pprof import (
    INT64_MAX,
    PYTHON_MAPPING,
    UNKNOWN,
    HeapSample,
    decode_profile,
    encode_heap_profile,
    heap_samples_from_tracebacks,
)

__all__ = [
    "INT64_MAX",
    "PYTHON_MAPPING",
    "UNKNOWN",
    "HeapSample",
    "decode_profile",
    "encode_heap_profile",
    "heap_samples_from_tracebacks",
]
