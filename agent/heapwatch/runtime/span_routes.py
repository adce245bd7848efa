"""The OpenTelemetry bridge: the current span's ``http.route`` labels allocations.

The framework instrumentations (Flask, FastAPI/Starlette) start each request's
server span with its ``http.route``.  ``RouteSpanProcessor`` gives the core
each span's route id as the span starts (its own ``http.route``, else its
parent's route, so the spans a request opens inside keep the request's
route) and forgets it as the span ends; the core reads the current span from
OpenTelemetry's context variable when it samples an allocation.

A guest never changes its host's tracing: the processor is added to the
service's own SDK ``TracerProvider`` (never a provider of ours, never a
replaced one), nothing happens while OpenTelemetry is not imported (we never
import it first), and nothing raises into the service.  Only ``http.route`` is
read, never the URL path: a raw path is no template.  Django sets
``http.route`` only after its URL resolution (process_view), after the span
started: its requests are not labelled by this bridge (use the middleware).
"""

from __future__ import annotations

import logging
import sys
import threading
from contextvars import ContextVar
from typing import Any

from heapwatch import _core
from heapwatch.runtime.forks import call_in_forked_child
from heapwatch.runtime.routes import ROUTE_NONE, route_id

__all__ = ["RouteSpanProcessor", "attach", "detach"]

log = logging.getLogger("heapwatch.routes")

_ROUTE_ATTRIBUTE = "http.route"


class RouteSpanProcessor:
    """A SpanProcessor; attached as a subclass of the SDK's too (``_processor``),
    so that hooks a later SDK adds get the SDK's defaults."""

    def __init__(self) -> None:
        self.active = True
        # span_id -> (route id, the span) of the spans started and not
        # ended, so a child finds its parent's route, and on_end, which the
        # SDK gives a ReadableSpan copy, forgets the started span's address
        # in the core; bounded as the core's table is.
        self._routes: dict[int, tuple[int, Any]] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if not self.active:
            return
        try:
            rid = self._route_of(span, parent_context)
            if rid != ROUTE_NONE and len(self._routes) < _core.SPAN_ROUTES:
                self._routes[span.get_span_context().span_id] = (rid, span)
                _core.span_route(span, rid)
        except Exception:  # never into the host's request
            log.debug("heapwatch could not read a span's route", exc_info=True)

    def _route_of(self, span: Any, parent_context: Any) -> int:
        attributes = getattr(span, "attributes", None)
        name = attributes.get(_ROUTE_ATTRIBUTE) if attributes else None
        if isinstance(name, str) and name:
            return route_id(name)
        from opentelemetry import trace  # noqa: PLC0415 (imported already: it calls us)

        parent = trace.get_current_span(parent_context).get_span_context()
        found = self._routes.get(parent.span_id) if parent.is_valid else None
        return found[0] if found is not None else ROUTE_NONE

    def on_end(self, span: Any) -> None:
        try:
            found = self._routes.pop(span.get_span_context().span_id, None)
            if found is not None:
                _core.span_route(found[1], ROUTE_NONE)
        except Exception:
            log.debug("heapwatch could not forget a span's route", exc_info=True)

    def _on_ending(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class _Bridge:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the fields below
        self.processor: RouteSpanProcessor | None = None
        self.provider: Any = None
        call_in_forked_child(self.after_fork_in_child)

    def after_fork_in_child(self) -> None:
        """The lock the parent's agent thread may have held is replaced."""
        self._lock = threading.Lock()

    def attach(self) -> bool:
        """Hooks the service's SDK provider, once; whether it is hooked."""
        trace = sys.modules.get("opentelemetry.trace")
        if trace is None:
            return False  # the service does not use OpenTelemetry (yet)
        with self._lock:
            try:
                # The global provider as set, not get_tracer_provider(), which
                # may create one from OTEL_PYTHON_TRACER_PROVIDER: the service's.
                provider = getattr(trace, "_TRACER_PROVIDER", None)
                if provider is None or provider is self.provider:
                    return provider is not None
                add = getattr(provider, "add_span_processor", None)
                found = _context_var()
                if add is None or found is None:
                    return False  # a no-op or proxy provider: not set up yet
                if self.processor is not None:
                    self.processor.active = False  # the previous provider's
                processor = _processor()
                add(processor)
                _core.set_span_routes(*found)
                self.processor, self.provider = processor, provider
                log.debug("heapwatch labels allocations with the current span's http.route")
                return True
            except Exception:
                log.debug("heapwatch could not hook OpenTelemetry's spans", exc_info=True)
                return False

    def detach(self) -> None:
        with self._lock:
            if self.processor is not None:
                self.processor.active = False
            self.processor = self.provider = None
            _core.set_span_routes(None, None)


def _processor() -> RouteSpanProcessor:
    sdk = sys.modules.get("opentelemetry.sdk.trace")
    base = getattr(sdk, "SpanProcessor", None)
    if isinstance(base, type):
        subclass = type("HeapwatchRouteSpanProcessor", (RouteSpanProcessor, base), {})
        processor: RouteSpanProcessor = subclass()
        return processor
    return RouteSpanProcessor()


def _context_var() -> tuple[ContextVar[Any], str] | None:
    """OpenTelemetry's runtime context variable and its current span's key.

    Both private in the API (stable since 1.0); when a release renames them,
    the bridge stays off rather than guess.
    """
    context = sys.modules.get("opentelemetry.context")
    propagation = sys.modules.get("opentelemetry.trace.propagation")
    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    key = getattr(propagation, "_SPAN_KEY", None)
    if isinstance(var, ContextVar) and isinstance(key, str):
        return var, key
    return None


_bridge = _Bridge()


def attach() -> bool:
    """Labels allocations with the current span's route once the service's
    SDK TracerProvider is set; cheap to call again (each agent cycle does)."""
    return _bridge.attach()


def detach() -> None:
    """The core stops reading spans; the processor added stays, inert."""
    _bridge.detach()
