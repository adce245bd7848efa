"""The one base class of heapwatch's own errors."""

from __future__ import annotations


class HeapwatchError(Exception):
    """Base class of the errors heapwatch raises itself."""
