"""Argument checks of heapwatch.tracemalloc.

Each returns the checked value in its canonical type, or raises the
exception the stdlib raises with the stdlib's message where the stdlib has
one; heapwatch's own arguments get messages naming the value and what is
allowed.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, SupportsIndex

from heapwatch import _core

if TYPE_CHECKING:
    from heapwatch._core import KeyType, Mode


def check_nframe(nframe: SupportsIndex) -> int:
    """nframe as an int in [1; MAX_NFRAME]; TypeError if it is not an integer."""
    value = operator.index(nframe)
    if not 1 <= value <= _core.MAX_NFRAME:
        raise ValueError(f"the number of frames must be in range [1; {_core.MAX_NFRAME}]")
    return value


def check_mode(mode: object) -> Mode:
    """mode as a Mode: 'exact' or 'sample'."""
    if mode == "exact":
        return "exact"
    if mode == "sample":
        return "sample"
    raise ValueError(f"mode must be 'exact' or 'sample', got {mode!r}")


def check_sample_interval(sample_interval: SupportsIndex, lowest: int = 1) -> int:
    """sample_interval as an int in [lowest; _core.MAX_SAMPLE_INTERVAL] bytes (the
    core's own bound, checked here to raise the stdlib's kind of message)."""
    value = operator.index(sample_interval)
    if not lowest <= value <= _core.MAX_SAMPLE_INTERVAL:
        raise ValueError(
            f"sample_interval must be in range [{lowest}; {_core.MAX_SAMPLE_INTERVAL}] bytes, "
            f"got {value!r}"
        )
    return value


def check_key_type(key_type: object, cumulative: object) -> KeyType:
    """key_type as a KeyType; the stdlib's ValueError if it is none of
    'traceback', 'filename', 'lineno', or if cumulative goes with 'traceback'."""
    if key_type not in ("traceback", "filename", "lineno"):
        raise ValueError(f"unknown key_type: {key_type!r}")
    if cumulative and key_type not in ("lineno", "filename"):
        raise ValueError(f"cumulative mode cannot by used with key type {key_type!r}")
    if key_type == "traceback":
        return "traceback"
    return "filename" if key_type == "filename" else "lineno"
