"""Where pickles of ``heapwatch.tracemalloc.Snapshot`` written before the
drop-in became a package look for their reconstructor: such a pickle names
``heapwatch._tm_snapshot._restore``, and must keep loading."""

from heapwatch.tracemalloc.snapshot import _restore

__all__ = ["_restore"]
