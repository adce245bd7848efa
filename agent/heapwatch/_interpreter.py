"""Refuses interpreters heapwatch's C core does not support, with a clear error.

Kept free of syntax newer than Python 3.6 (f-strings) so that old interpreters
reach the check and read the message instead of a SyntaxError.  Imports only
``sys``: every ``import heapwatch`` runs this module; typing alone would cost
about 20 ms (so the annotations are strings that only type checkers read) and
``sysconfig`` imports ``threading`` on 3.12.
"""

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from collections.abc import Sequence

SUPPORTED_MIN = (3, 9)
SUPPORTED_MAX = (3, 15)


def unsupported_reason(
    implementation: str, version_info: "Sequence[int]", gil_disabled: bool
) -> "str | None":
    """Why this interpreter is unsupported, or None if it is supported."""
    if implementation != "cpython":
        return f"heapwatch needs CPython; this interpreter is {implementation}"
    version = tuple(version_info[:2])
    if not (SUPPORTED_MIN <= version <= SUPPORTED_MAX):
        lowest, highest, this = (
            ".".join(map(str, v)) for v in (SUPPORTED_MIN, SUPPORTED_MAX, version)
        )
        return f"heapwatch supports CPython {lowest} to {highest}; this is CPython {this}"
    if gil_disabled:
        return (
            "heapwatch does not support free-threaded CPython builds "
            "(Py_GIL_DISABLED): its allocator hooks rely on the GIL"
        )
    return None


def _gil_disabled_build() -> bool:
    abiflags = getattr(sys, "abiflags", None)
    if abiflags is not None:
        return "t" in abiflags  # PEP 703: free-threaded builds carry the "t" flag
    import sysconfig  # noqa: PLC0415  (no abiflags, Windows: the build config says)

    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def check() -> None:
    """Raises ImportError when the running interpreter is unsupported."""
    reason = unsupported_reason(
        sys.implementation.name,
        sys.version_info[:2],  # the major and minor numbers: sys.version_info ends with a str
        _gil_disabled_build(),
    )
    if reason is not None:
        raise ImportError(reason)
