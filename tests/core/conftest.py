"""Fixtures for driving heapwatch._core directly."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from heapwatch import _core

HERE = Path(__file__).resolve().parent


@pytest.fixture
def core() -> Iterator[ModuleType]:
    """heapwatch._core, stopped before and after the test, invariants checked."""
    _core.stop()
    try:
        yield _core
        if _core.is_tracing():
            _core._check_invariants()
    finally:
        _core.stop()


def _build_hwtest(build_dir: Path, *flags: str) -> Path:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = build_dir / f"_hwtest{suffix}"
    include = sysconfig.get_paths()["include"]
    cmd = [
        sysconfig.get_config_var("CC").split()[0] or "cc",
        "-shared",
        "-fPIC",
        "-O1",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        *flags,
        f"-I{include}",
        str(HERE / "hwtest" / "_hwtest.c"),
        "-o",
        str(target),
        "-lpthread",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return target


@pytest.fixture(scope="session")
def hwtest(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """A test-only C extension that allocates without the GIL (hwtest/_hwtest.c)."""
    path = _build_hwtest(tmp_path_factory.mktemp("hwtest"))
    spec = importlib.util.spec_from_file_location("_hwtest", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["_hwtest"] = module
    return module


@pytest.fixture(scope="session")
def hwtest_no_plt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The path of _hwtest built with -fno-plt, not imported: its calls to the
    C API go through GOT entries of the other kind (R_X86_64_GLOB_DAT)."""
    return _build_hwtest(tmp_path_factory.mktemp("hwtest-no-plt"), "-fno-plt")
