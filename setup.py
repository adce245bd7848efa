"""Builds heapwatch._core and ships the auto-start ``.pth`` hook.

Metadata lives in pyproject.toml; this file only holds what setuptools cannot
express there: the C extension's flags and a ``.pth`` file at the root of
site-packages.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CSRC = HERE / "agent" / "csrc"
PTH_NAME = "heapwatch-autostart.pth"


def _refuse_unsupported_interpreter() -> None:
    if sys.implementation.name != "cpython":
        sys.exit(f"heapwatch needs CPython; this is {sys.implementation.name}")
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        sys.exit("heapwatch does not support free-threaded CPython builds (Py_GIL_DISABLED)")


def _compile_args() -> list[str]:
    # -flto lets the hooks inline the table and traceback helpers across files.
    args = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-fvisibility=hidden", "-flto"]
    if os.environ.get("HEAPWATCH_SANITIZE"):
        args = [a for a in args if a != "-O2"]
        args += ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                 "-fno-sanitize-recover=undefined"]
    if os.environ.get("HEAPWATCH_DEBUG"):
        args += ["-g", "-UNDEBUG", "-DHW_DEBUG=1"]
    return args


def _build_options() -> dict[str, dict[str, str]]:
    # Builds with other flags keep their objects apart: setuptools reuses an
    # object newer than its source whatever flags compiled it, so a sanitizer
    # build would otherwise end up in the next plain one of the same Python.
    # Each interpreter has a tree of its own too (its wheel's staging
    # directory and metadata included): make ci builds two at once.
    base = f"build/{sys.implementation.cache_tag}"
    for variable, flavour in (("HEAPWATCH_SANITIZE", "sanitize"), ("HEAPWATCH_DEBUG", "debug")):
        if os.environ.get(variable):
            base += f"-{flavour}"
            break
    os.makedirs(base, exist_ok=True)
    return {"build": {"build_base": base}, "egg_info": {"egg_base": base}}


def _link_args() -> list[str]:
    if os.environ.get("HEAPWATCH_SANITIZE"):
        return ["-fsanitize=address,undefined"]
    return ["-flto", "-O2"]


class BuildPyWithPth(build_py):
    """Copies the auto-start hook to the root of the installed tree."""

    def run(self) -> None:
        super().run()
        source = HERE / "agent" / PTH_NAME
        self.copy_file(str(source), os.path.join(self.build_lib, PTH_NAME), preserve_mode=0)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:  # type: ignore[override]
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH_NAME)]


_refuse_unsupported_interpreter()

core = Extension(
    "heapwatch._core",
    sources=sorted(str(p.relative_to(HERE)) for p in CSRC.glob("*.c")),
    depends=sorted(str(p.relative_to(HERE)) for p in CSRC.glob("*.h")),
    include_dirs=[str(CSRC.relative_to(HERE))],
    extra_compile_args=_compile_args(),
    extra_link_args=_link_args(),
    # dl and pthread: dlopen, pthread_once and pthread_key_create live there
    # before glibc 2.34, which the wheels are built against.
    libraries=["m", "dl", "pthread"],
)

setup(ext_modules=[core], cmdclass={"build_py": BuildPyWithPth}, options=_build_options())
