"""heapwatch: an always-on memory monitor for Python services.

``heapwatch.tracemalloc`` is a drop-in for the stdlib module, backed by
heapwatch's own allocator hooks.  The agent (``start_agent``) publishes what it
sees to Prometheus and OpenTelemetry.
"""

from heapwatch._interpreter import check as _check_interpreter

_check_interpreter()

from heapwatch._errors import HeapwatchError  # noqa: E402

__version__ = "0.1.0"

__all__ = ["HeapwatchError", "__version__"]
