"""The OpenTelemetry bridge (heapwatch.runtime.span_routes), each case in a
fresh process: a process has one global TracerProvider."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

PRELUDE = """
import math, sys
from heapwatch import _core
from heapwatch.runtime import route_labels, span_routes
from heapwatch.runtime.routes import route_name

SIZE = 32 * 1024
INTERVAL = 8 * 1024

def alloc(keep, n=200):
    for _ in range(n):
        keep.append(bytes(SIZE))  # the site

SITE = alloc.__code__.co_firstlineno + 2

def by_route():
    snap = _core.take_snapshot()
    sums = {}
    for rid, row in zip(snap.routes(), snap.tracebacks(names=True)):
        if row[1][0][1] == SITE and row[1][0][0] == "<string>":
            sums[route_name(rid)] = sums.get(route_name(rid), 0) + row[3]
    return sums

def close(got, blocks):
    block = sys.getsizeof(bytes(SIZE))
    p = 1 - math.exp(-block / INTERVAL)
    return abs(got - blocks * block) <= 6 * math.sqrt(blocks * (1 - p) / p) * block
"""


def run(body: str) -> None:
    code = PRELUDE + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_span_s_route_and_its_children_label_allocations() -> None:
    run("""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        _core.start(1, "sample", INTERVAL)
        route_labels.enable()
        assert not span_routes._bridge.provider  # the service set up nothing yet
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        route_labels.poll()  # the agent's next cycle
        tracer = trace.get_tracer("test")
        keep = []
        route = {"http.route": "/items/{id}"}
        with tracer.start_as_current_span("GET /items/{id}", attributes=route):
            alloc(keep)
            with tracer.start_as_current_span("db query"):  # a child: no http.route
                alloc(keep)
        with tracer.start_as_current_span("no route"):
            alloc(keep)
        found = by_route()
        assert close(found["/items/{id}"], 400), found
        assert close(found["<none>"], 200), found
        assert _core.get_stats()["span_routes"] == 0  # every ended span forgotten
        route_labels.disable()
        _core.stop()
    """)


def test_nothing_happens_without_opentelemetry() -> None:
    run("""
        _core.start(1, "sample", INTERVAL)
        route_labels.enable()
        route_labels.poll()
        assert "opentelemetry" not in sys.modules  # never imported by us
        assert span_routes.attach() is False
        route_labels.disable()
        _core.stop()
    """)


def test_a_failing_span_never_raises_into_the_host() -> None:
    run("""
        from heapwatch.runtime.span_routes import RouteSpanProcessor
        class Broken:
            attributes = {"http.route": 42}
            def get_span_context(self):
                raise RuntimeError("broken span")
        processor = RouteSpanProcessor()
        processor.on_start(Broken(), None)
        processor.on_end(Broken())
    """)
