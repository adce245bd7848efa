"""Trace filters of heapwatch.tracemalloc, with the stdlib's semantics.

A filter's ``_match(trace)`` takes a raw trace tuple ``(domain, size, frames,
total_nframe)`` (frames most recent first) and says whether the trace is
kept: for an exclusive filter, True means "not excluded".  Filter and
DomainFilter look only at the domain and the frames, never at the size, so a
core-backed Snapshot may evaluate them once per distinct traceback.
"""

from __future__ import annotations

import fnmatch
import os.path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heapwatch._core import Frames, RawTrace


def _normalize_filename(filename: str) -> str:
    """The filename as patterns see it: case-normalised, ``.pyc`` read as ``.py``."""
    filename = os.path.normcase(filename)
    if filename.endswith(".pyc"):
        filename = filename[:-1]
    return filename


_HERE = os.path.normcase(os.path.dirname(os.path.abspath(__file__)))
# The stdlib hides its tracer's own allocations with
# Filter(False, tracemalloc.__file__): one file there, a package here
# (tracemalloc/__init__.py and its siblings).  That pattern covers every
# module of the drop-in.
_DROP_IN_FILE = os.path.join(_HERE, "__init__.py")


def _is_drop_in_module(filename: str) -> bool:
    """Whether a normalised filename is a module of heapwatch.tracemalloc."""
    directory, name = os.path.split(filename)
    return directory == _HERE and name.endswith(".py")


class BaseFilter:
    """Base class of the filters that Snapshot.filter_traces() accepts."""

    def __init__(self, inclusive: bool) -> None:
        self.inclusive = inclusive

    def _match(self, trace: RawTrace) -> bool:
        raise NotImplementedError


class Filter(BaseFilter):
    """Keeps (inclusive) or drops (exclusive) traces allocated in files matching
    an fnmatch pattern, optionally at one line number and in one domain.

    Only the most recent frame is checked unless ``all_frames`` is true.
    """

    def __init__(
        self,
        inclusive: bool,
        filename_pattern: str,
        lineno: int | None = None,
        all_frames: bool = False,
        domain: int | None = None,
    ) -> None:
        super().__init__(inclusive)
        self._filename_pattern = _normalize_filename(filename_pattern)
        self.lineno = lineno
        self.all_frames = all_frames
        self.domain = domain

    @property
    def filename_pattern(self) -> str:
        return self._filename_pattern

    def _match_frame_impl(self, filename: str, lineno: int) -> bool:
        name = _normalize_filename(filename)
        if not fnmatch.fnmatch(name, self._filename_pattern) and not (
            self._filename_pattern == _DROP_IN_FILE and _is_drop_in_module(name)
        ):
            return False
        return self.lineno is None or lineno == self.lineno

    def _match_frame(self, filename: str, lineno: int) -> bool:
        return self._match_frame_impl(filename, lineno) ^ (not self.inclusive)

    def _match_traceback(self, frames: Frames) -> bool:
        if self.all_frames:
            if any(self._match_frame_impl(filename, lineno) for filename, lineno in frames):
                return bool(self.inclusive)
            return not self.inclusive
        filename, lineno = frames[0]
        return self._match_frame(filename, lineno)

    def _match(self, trace: RawTrace) -> bool:
        domain, _size, frames, _total_nframe = trace
        matched = self._match_traceback(frames)
        if self.domain is None:
            return matched
        if self.inclusive:
            return matched and domain == self.domain
        return matched or domain != self.domain


class DomainFilter(BaseFilter):
    """Keeps (inclusive) or drops (exclusive) the traces of one domain."""

    def __init__(self, inclusive: bool, domain: int) -> None:
        super().__init__(inclusive)
        self._domain = domain

    @property
    def domain(self) -> int:
        return self._domain

    def _match(self, trace: RawTrace) -> bool:
        domain, _size, _frames, _total_nframe = trace
        return (domain == self.domain) ^ (not self.inclusive)


def _keeps(include: list[BaseFilter], exclude: list[BaseFilter], trace: RawTrace) -> bool:
    """Whether filter_traces() keeps the trace: some inclusive filter (if there
    are any) matches it, and no exclusive filter excludes it."""
    if include and not any(f._match(trace) for f in include):
        return False
    return all(f._match(trace) for f in exclude)
