"""Refuses interpreters heapwatch's C core does not support, with a clear error.

Kept free of syntax newer than Python 3.7 so that old interpreters reach the
check and read the message instead of a SyntaxError.
"""

import sys
import sysconfig
from typing import Optional, Sequence

SUPPORTED_MIN = (3, 9)
SUPPORTED_MAX = (3, 13)


def unsupported_reason(
    implementation: str, version_info: Sequence[int], gil_disabled: bool
) -> Optional[str]:
    """Why this interpreter is unsupported, or None if it is supported."""
    if implementation != "cpython":
        return "heapwatch needs CPython; this interpreter is %s" % implementation
    version = tuple(version_info[:2])
    if not (SUPPORTED_MIN <= version <= SUPPORTED_MAX):
        return "heapwatch supports CPython %d.%d to %d.%d; this is CPython %d.%d" % (
            SUPPORTED_MIN + SUPPORTED_MAX + version
        )
    if gil_disabled:
        return (
            "heapwatch does not support free-threaded CPython builds "
            "(Py_GIL_DISABLED): its allocator hooks rely on the GIL"
        )
    return None


def check() -> None:
    """Raises ImportError when the running interpreter is unsupported."""
    reason = unsupported_reason(
        sys.implementation.name,
        sys.version_info,
        bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    )
    if reason is not None:
        raise ImportError(reason)
