"""What heapwatch's objects do in a forked child.

A child gets a copy of the parent's objects, and of their locks as another
thread of the parent may have held them: an object that keeps a lock, a
thread or a descriptor registers a method that renews it in the child.
An object that runs threads also steps them out of the way around each
fork, so that none is alive when the interpreter counts the threads
(docs/design/agent.md, "Fork").
"""

from __future__ import annotations

import os
import sys
import weakref
from types import FrameType
from typing import Callable

__all__ = ["call_around_fork", "call_before_fork", "call_in_forked_child", "forking_frame"]

# The frame that called os.fork(), while the after_in_parent hooks of
# call_around_fork run; the forking thread's only.
_forking_frame: FrameType | None = None


def _weakly(method: Callable[[], object]) -> Callable[[], None]:
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:
            bound()

    return call


def call_in_forked_child(method: Callable[[], object]) -> None:
    """Calls the bound ``method`` in every forked child (an after_in_child
    hook, run in registration order), for as long as its object lives."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_weakly(method))


def call_before_fork(method: Callable[[], object]) -> None:
    """Calls the bound ``method`` in the parent before every fork (a before
    hook), for as long as its object lives."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_weakly(method))


def call_around_fork(before: Callable[[], object], after_in_parent: Callable[[], object]) -> None:
    """Calls the bound ``before`` in the parent before every fork and the
    bound ``after_in_parent`` once it returned there, for as long as their
    object lives.  Before hooks run last registered first, the others first
    registered first: registered together, they nest around the later ones."""
    if hasattr(os, "register_at_fork"):
        after = _weakly(after_in_parent)

        def after_noting_the_caller() -> None:
            global _forking_frame
            # Called from os.fork(), in C: the frame below is its caller's.
            _forking_frame = sys._getframe(1)
            try:
                after()
            finally:
                _forking_frame = None

        os.register_at_fork(before=_weakly(before), after_in_parent=after_noting_the_caller)


def forking_frame() -> FrameType | None:
    """In an after_in_parent hook of ``call_around_fork``: the frame of the
    code that called ``os.fork()`` (the one running again once it returns)."""
    return _forking_frame
