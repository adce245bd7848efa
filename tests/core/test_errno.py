"""The hooks leave errno as the allocator under them leaves it.

C code reads errno after calls that allocate or free on their way out:
CPython's _Py_wfopen frees the path between fopen() and its caller's
PyErr_SetFromErrno(), so a hook that changed errno turned getpath's
FileNotFoundError into BlockingIOError (EAGAIN, from the futex wait of a
contended lock) and a sub-interpreter failed to start on 3.15."""

from __future__ import annotations

import errno
from types import ModuleType

import pytest


@pytest.mark.parametrize("mode", [None, "exact", "sample"])
def test_allocator_calls_keep_errno_while_the_hooks_lock_is_contended(
    core: ModuleType, hwtest: ModuleType, mode: str | None
) -> None:
    # Untraced, the probe shows what the allocators alone do: nothing.  A
    # small sampling interval makes sample points common, so that sample
    # mode takes its slow paths (and the lock) often.
    if mode is not None:
        core.start(5, mode, *([64] if mode == "sample" else []))
    changed, seen = hwtest.errno_churn(200_000, 3)
    assert (changed, errno.errorcode.get(seen, seen)) == (0, 0)
