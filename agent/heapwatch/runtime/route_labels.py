"""Switches the core's route labels on and off (the agent, in sample mode).

On: the core reads ``current_route`` (heapwatch's middlewares and ``route()``)
at each sampled allocation, and, when it gives no route, the current
OpenTelemetry span's route once the service's SDK provider is set up
(``poll`` hooks it when it appears: the auto-start hook runs before the
service configures OpenTelemetry).
"""

from __future__ import annotations

from heapwatch import _core
from heapwatch.runtime import span_routes
from heapwatch.runtime.routes import current_route

__all__ = ["disable", "enable", "poll"]

_enabled = False


def enable() -> None:
    global _enabled
    _enabled = True
    _core.set_route_var(current_route)
    span_routes.attach()


def poll() -> None:
    """Hooks OpenTelemetry's provider if it appeared since and labels are on
    (the agent's cycle, and opentelemetry-instrument once it set it up)."""
    if _enabled:
        span_routes.attach()


def disable() -> None:
    global _enabled
    _enabled = False
    _core.set_route_var(None)
    span_routes.detach()
