"""The registry's names, as the readers of snapshots need them (issue 26).

A snapshot's route ids come from the core, which takes any int a
ContextVar holds (1 to 65535): an id the registry never handed out (a
variable set by hand) is named as the names it refused, ``<other>``, never
an error in a cycle, a dump or a profile.
"""

from __future__ import annotations

from collections.abc import Iterable

from heapwatch.runtime.routes import ROUTE_NONE, ROUTE_OTHER, route_name

__all__ = ["name_of", "names_of"]


def name_of(rid: int) -> str:
    """The name of route id ``rid``: ``<none>``, ``<other>`` or a template."""
    try:
        return route_name(rid)
    except ValueError:
        return route_name(ROUTE_OTHER)


def names_of(ids: Iterable[int]) -> dict[int, str]:
    """The name of each distinct route id of ``ids`` but ``ROUTE_NONE``
    (what a dump's writer is given)."""
    return {rid: name_of(rid) for rid in set(ids) if rid != ROUTE_NONE}
