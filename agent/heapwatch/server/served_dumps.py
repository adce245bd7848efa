"""The agent's ``dumps`` component (``heapwatch.agent.plugins``): the dump
service, its black box, and its ``/debug/`` routes when the agent serves.

Apart from ``heapwatch.server.debug_routes`` so that an agent that serves
nothing (no exporter with routes, no token) never imports the routes and what
they need (the dump and pprof formats, the reports, json, urllib): every
Python process started with ``HEAPWATCH_ENABLED`` pays for what the agent
imports, a service's short-lived children included.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from heapwatch.runtime.container import read_limit
from heapwatch.server.black_box import BlackBoxWatcher, report_previous_black_box
from heapwatch.server.dumps import DumpService

if TYPE_CHECKING:
    from heapwatch.agent.interface import AgentView

__all__ = ["ServedDumpService", "black_box_for"]

log = logging.getLogger("heapwatch.black_box")


def black_box_for(service: DumpService, agent: AgentView) -> BlackBoxWatcher | None:
    """The black box of ``service``, when it has somewhere to write
    (``dump_dir``), thresholds (``dump_at``) and a limit to compare with (the
    process's memory cgroup has one); else None, and a line says why when
    one was asked for."""
    config = service.config
    if config.dump_dir is None or not config.dump_at:
        return None
    cgroup = agent.cgroup
    limit = read_limit(cgroup) if cgroup is not None else None
    if cgroup is None or limit is None:
        log.info(
            "heapwatch's black box is off: %s",
            "no memory cgroup" if cgroup is None else "the container has no memory limit",
        )
        return None
    for threshold in config.dump_at:
        if threshold.bytes_of(limit) > limit:
            log.warning(
                "HEAPWATCH_DUMP_AT=%s: %s is above the container's memory limit (%d bytes) "
                "and is never reached",
                ",".join(map(str, config.dump_at)),
                threshold,
                limit,
            )
    return BlackBoxWatcher(
        service,
        cgroup,
        config.dump_at,
        limit,
        termination_log=config.termination_log,
        agent=agent,
    )


class ServedDumpService(DumpService):
    """The dump service with its black box and its ``/debug/`` routes."""

    black_box: BlackBoxWatcher | None = None
    # Whether this service looked for an earlier process's black box: once,
    # in the process that started it (a forked child's parent looked).
    _looked_back = False

    def start(self, agent: AgentView) -> None:
        """Adds the ``/debug/`` routes, unless the agent serves nothing else
        and has no token (they would only answer 403 on a port opened for
        them), then starts the service (the dump signal) and its black box."""
        router = agent.router
        if router.token or router:
            from heapwatch.server.debug_routes import add_routes  # noqa: PLC0415 (only to serve)

            add_routes(router, self)
            agent.retain_last_snapshot = True
        super().start(agent)
        if not self._looked_back and self.config.dump_dir is not None:
            self._looked_back = True
            report_previous_black_box(self.config.dump_dir, agent)
        if self.black_box is None:
            self.black_box = black_box_for(self, agent)
        if self.black_box is not None:
            self.black_box.start()

    def shutdown(self, timeout: float) -> None:
        """Stops the black box (marking its dumps: this process exits
        cleanly), then the service."""
        black_box = self.black_box
        if black_box is not None:
            black_box.stop(timeout)
            black_box.mark_exited()
        super().shutdown(timeout)

    def pause_for_fork(self, deadline: float) -> bool:
        black_box = self.black_box
        ended = black_box.pause(deadline) if black_box is not None else True
        return super().pause_for_fork(deadline) and ended

    def resume_after_fork(self) -> None:
        super().resume_after_fork()
        if self.black_box is not None:
            self.black_box.resume()

    def after_fork_in_child(self) -> None:
        if self.black_box is not None:
            self.black_box.after_fork_in_child()
        super().after_fork_in_child()
