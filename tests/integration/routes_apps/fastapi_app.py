"""FastAPI: /keep/{n} keeps n blocks, /churn/{n} allocates and frees them,
each awaiting between blocks so that concurrent requests interleave."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import FastAPI
from truth import by_route, keep_one, new_block

app = FastAPI()


@app.get("/keep/{n}")
async def keep(n: int) -> str:
    for _ in range(n):
        keep_one()
        await asyncio.sleep(0)
    return "kept"


@app.get("/churn/{n}")
async def churn(n: int) -> int:
    total = 0
    for _ in range(n):
        block = new_block()  # held across the await: other requests run meanwhile
        await asyncio.sleep(0)
        total += len(block)
        del block
    return total


@app.get("/truth")
def truth() -> dict[str, Any]:
    return by_route()


if os.environ.get("ROUTES_OTEL_SDK") == "1":
    # As a service without opentelemetry-distro sets up tracing, after
    # opentelemetry-instrument started the agent: it hooks the provider at
    # its next cycle.
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())

if os.environ.get("ROUTES_MIDDLEWARE") == "1":
    from heapwatch.routes import ASGIMiddleware

    app.add_middleware(ASGIMiddleware)
