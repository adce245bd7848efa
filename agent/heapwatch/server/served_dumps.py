"""The agent's ``dumps`` component (``heapwatch.agent.plugins``): the dump
service, and its ``/debug/`` routes when the agent serves.

Apart from ``heapwatch.server.debug_routes`` so that an agent that serves
nothing (no exporter with routes, no token) never imports the routes and what
they need (the dump and pprof formats, the reports, json, urllib): every
Python process started with ``HEAPWATCH_ENABLED`` pays for what the agent
imports, a service's short-lived children included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from heapwatch.server.dumps import DumpService

if TYPE_CHECKING:
    from heapwatch.agent.interface import AgentView

__all__ = ["ServedDumpService"]


class ServedDumpService(DumpService):
    """The dump service with its ``/debug/`` routes."""

    def start(self, agent: AgentView) -> None:
        """Adds the ``/debug/`` routes, unless the agent serves nothing else
        and has no token (they would only answer 403 on a port opened for
        them), then starts the service (the dump signal)."""
        router = agent.router
        if router.token or router:
            from heapwatch.server.debug_routes import add_routes  # noqa: PLC0415 (only to serve)

            add_routes(router, self)
            agent.retain_last_snapshot = True
        super().start(agent)
