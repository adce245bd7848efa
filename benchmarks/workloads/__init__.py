"""The allocation-heavy workloads of the slowdown suite.

Each module defines ``DESCRIPTION`` (one line, for ``run.py --list`` and the
README) and ``prepare(scale) -> Callable[[], object]``: ``prepare`` builds any
input outside the timed region and returns the timed callable.  At scale 1.0
the callable takes about 0.2 to 0.5 s untraced on a current x86-64 core.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable, Protocol, cast

# name -> module under benchmarks/workloads/, in table order.
WORKLOADS: dict[str, str] = {
    "churn": "churn",
    "dict_1m": "dict_1m",
    "json": "json_roundtrip",
    "deep_stack": "deep_stack",
    "threads": "threads",
}


class Workload(Protocol):
    DESCRIPTION: str

    def prepare(self, scale: float) -> Callable[[], object]: ...


def load(name: str) -> Workload:
    module: ModuleType = importlib.import_module(f"workloads.{WORKLOADS[name]}")
    return cast(Workload, module)
