"""The route registry: route names (templates) as small ints for the core.

The core labels each sampled allocation with an int it reads from
``current_route`` (a ContextVar, so threads and asyncio tasks each see their
own request); this module gives those ints their names.  Ids are interned
once and never reused within a process, so an id read from any snapshot
keeps its name.

Two ids are reserved: ``ROUTE_NONE`` (0, what the core records outside any
request) and ``ROUTE_OTHER`` (1, the names refused because ``MAX_ROUTES``
distinct names were already interned; ``folded_routes()`` counts them).
Route names are templates (``/items/{id}``), never raw paths: a raw path per
request would fill the cap with one-off names and fold every later route
into ``<other>``.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar

from heapwatch.formats.rows import NO_ROUTE
from heapwatch.runtime.forks import call_in_forked_child

__all__ = [
    "MAX_ROUTES",
    "ROUTE_NONE",
    "ROUTE_OTHER",
    "current_route",
    "folded_routes",
    "route_id",
    "route_name",
]

ROUTE_NONE = 0
ROUTE_OTHER = 1
# Distinct route names a process interns (ids 2 .. MAX_ROUTES + 1).  A web
# service has tens to hundreds of route templates; a thousand leaves room
# while bounding the memory and the label sets a misuse (raw paths) creates.
MAX_ROUTES = 1000
_FIRST_NAMED = 2

_NONE_NAME = NO_ROUTE  # one home: dumps read without this registry name it too
_OTHER_NAME = "<other>"
# Longest route name kept; a longer one is refused (it is no template).
_MAX_NAME_LENGTH = 512

current_route: ContextVar[int] = ContextVar("heapwatch_route", default=ROUTE_NONE)


class _Registry:
    def __init__(self, max_routes: int = MAX_ROUTES) -> None:
        self.max_routes = max_routes
        # Reads go without the lock (a dict lookup is atomic under the GIL);
        # interning a new name takes it, so two threads agree on one id.
        self._lock = threading.Lock()  # guards the writes of _ids, _names, _folded
        self._ids: dict[str, int] = {_NONE_NAME: ROUTE_NONE, _OTHER_NAME: ROUTE_OTHER}
        self._names: list[str] = [_NONE_NAME, _OTHER_NAME]
        # Distinct folded names, remembered up to max_routes; past that each
        # refusal of a name not remembered counts (the memory stays bounded).
        self._folded: set[str] = set()
        self._folded_past: int = 0
        call_in_forked_child(self.after_fork_in_child)

    def after_fork_in_child(self) -> None:
        """A lock another thread of the parent held is replaced; ids stay."""
        self._lock = threading.Lock()

    def route_id(self, name: str) -> int:
        rid = self._ids.get(name)
        if rid is not None:
            return rid
        if not isinstance(name, str):
            raise TypeError(f"route name must be a str, not {type(name).__name__}: {name!r}")
        if not name or len(name) > _MAX_NAME_LENGTH:
            raise ValueError(
                f"route name must be 1 to {_MAX_NAME_LENGTH} characters long, "
                f"got {len(name)}: {name[:80]!r}"
            )
        with self._lock:
            rid = self._ids.get(name)
            if rid is not None:
                return rid
            if len(self._names) - _FIRST_NAMED >= self.max_routes:
                # Counted once per name: the folded counter says how many
                # distinct routes <other> hides, not how many requests.
                if name in self._folded:
                    pass
                elif len(self._folded) < self.max_routes:
                    self._folded.add(name)
                else:
                    self._folded_past += 1
                return ROUTE_OTHER
            rid = len(self._names)
            self._names.append(name)
            self._ids[name] = rid
            return rid

    def route_name(self, rid: int) -> str:
        if isinstance(rid, bool) or not isinstance(rid, int):
            raise TypeError(f"route id must be an int, not {type(rid).__name__}: {rid!r}")
        names = self._names
        if 0 <= rid < len(names):
            return names[rid]
        raise ValueError(f"unknown route id {rid}: interned ids are 0 to {len(names) - 1}")

    def folded_routes(self) -> int:
        return len(self._folded) + self._folded_past


_registry = _Registry()


def route_id(name: str) -> int:
    """The id of the route ``name`` (a template such as ``/items/{id}``).

    Interned on first use, thread-safe.  Past ``MAX_ROUTES`` distinct names
    a new name gets ``ROUTE_OTHER`` and is counted by ``folded_routes()``.
    ``"<none>"`` and ``"<other>"`` are the reserved ids' names.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: ``name`` is empty or longer than 512 characters.
    """
    return _registry.route_id(name)


def route_name(rid: int) -> str:
    """The name of route id ``rid``: ``"<none>"``, ``"<other>"`` or a template.

    Raises:
        TypeError: ``rid`` is not an int.
        ValueError: no route has that id.
    """
    return _registry.route_name(rid)


def folded_routes() -> int:
    """How many distinct route names the cap refused (summed in ``<other>``).

    Each name counts once while at most ``MAX_ROUTES`` are folded; past
    that (raw paths as names) every refusal of a further name counts.
    """
    return _registry.folded_routes()
