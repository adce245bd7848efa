"""Interpreters heapwatch does not support: a clear ImportError, and an
auto-start hook that says so in one line instead of a traceback from site.py.

Runs the old CPythons that tools/find-python finds on this machine (pyenv
installs them); skips the versions it does not find.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import heapwatch
from heapwatch._interpreter import SUPPORTED_MAX, SUPPORTED_MIN
from support.agent_process import clean_env

FIND_PYTHON = Path(__file__).resolve().parents[2] / "tools" / "find-python"
OLD_VERSIONS = ["3.6", "3.7", "3.8"]
# Where ``import heapwatch`` found the package: site-packages when installed,
# agent/ in the source tree.  Both hold the .pth hook beside the package.
ROOT = Path(heapwatch.__file__).resolve().parents[1]


def old_python(version: str) -> str:
    if not FIND_PYTHON.exists():
        pytest.skip(f"{FIND_PYTHON} is not here (not a source checkout)")
    found = subprocess.run(
        [str(FIND_PYTHON), version], capture_output=True, text=True, timeout=60, check=False
    )
    if found.returncode != 0:
        pytest.skip(f"no CPython {version} on this machine")
    return found.stdout.strip()


def refusal(version: str) -> str:
    lowest, highest = (".".join(map(str, v)) for v in (SUPPORTED_MIN, SUPPORTED_MAX))
    return f"heapwatch supports CPython {lowest} to {highest}; this is CPython {version}"


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_importing_heapwatch_on_an_old_python_raises_a_clear_import_error(
    tmp_path: Path, version: str
) -> None:
    # Given the package on the path of an old interpreter
    python = old_python(version)
    (tmp_path / "heapwatch").symlink_to(ROOT / "heapwatch")
    # When it imports heapwatch
    done = subprocess.run(
        [python, "-c", "import heapwatch"],
        env=clean_env(PYTHONPATH=str(tmp_path)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then it gets an ImportError that says why (not a SyntaxError)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "ImportError: " + refusal(version), done.stderr


@pytest.mark.parametrize("version", OLD_VERSIONS)
@pytest.mark.parametrize("enabled", ["1", "0"])
def test_the_pth_hook_on_an_old_python_warns_in_one_line(
    tmp_path: Path, version: str, enabled: str
) -> None:
    # Given heapwatch and its hook in the user site-packages of an old interpreter
    python = old_python(version)
    site_packages = tmp_path / "lib" / f"python{version}" / "site-packages"
    site_packages.mkdir(parents=True)
    for name in ("heapwatch-autostart.pth", "_heapwatch_pth.py"):
        shutil.copy(ROOT / name, site_packages / name)
    (site_packages / "heapwatch").symlink_to(ROOT / "heapwatch")
    env = clean_env(PYTHONUSERBASE=str(tmp_path), HEAPWATCH_ENABLED=enabled)
    env.pop("PYTHONNOUSERSITE", None)
    # When a program starts
    done = subprocess.run(
        [python, "-c", "import sys; print(sys.modules.get('_heapwatch_pth') is not None)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Then it runs; switched on, the hook ran and said in one line why heapwatch is off
    assert done.returncode == 0, done.stderr
    if enabled == "1":
        assert done.stdout == "True\n"
        assert done.stderr == (
            "heapwatch auto-start skipped; the service runs without it: " + refusal(version) + "\n"
        )
    else:
        assert done.stdout == "False\n"
        assert done.stderr == ""
