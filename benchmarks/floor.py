"""The ``hooks-only`` configuration: allocator hooks that only forward
(floor/hooks_only.c), the floor under sample mode's cost; and
``hooks-countdown``: the same hooks taking each call's bytes off a countdown
that never runs out, the least any sampler by bytes can cost.

run.py builds the extension before the first child starts, with this
interpreter's C compiler, and names it to the children in FLOOR_ENV; a child
then imports it whatever its configuration, as it imports both tracers.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "floor" / "hooks_only.c"
MODULE = "hw_bench_floor"
# The configurations' names in run.py and tracers.py.
CONFIG = "hooks-only"
COUNTDOWN_CONFIG = "hooks-countdown"
CONFIGS = (CONFIG, COUNTDOWN_CONFIG)
# The built extension's path, from run.py to its children.
FLOOR_ENV = "HEAPWATCH_BENCH_FLOOR"


def build(out_dir: Path) -> Path:
    """Compiles the extension into out_dir (again only if the source is
    newer) and returns its path.  Raises RuntimeError with the compiler's
    output if it fails."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = out_dir / f"{MODULE}{suffix}"
    if target.exists() and target.stat().st_mtime >= SOURCE.stat().st_mtime:
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    cmd = [
        *compiler,
        "-O2",
        "-fPIC",
        "-shared",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{include}",
        str(SOURCE),
        "-o",
        str(target),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"cannot build the hooks-only extension ({shlex.join(cmd)}):\n{proc.stderr.strip()}"
        )
    return target


def load() -> ModuleType | None:
    """The extension run.py built, or None when it built none."""
    path = os.environ.get(FLOOR_ENV)
    if not path:
        return None
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{FLOOR_ENV}={path!r} is not an extension module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    spec.loader.exec_module(module)
    return module
