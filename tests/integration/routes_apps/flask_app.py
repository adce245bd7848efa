"""Flask: /keep/<int:n> keeps n blocks, /churn/<int:n> allocates and frees them."""

from __future__ import annotations

import os

from flask import Flask, jsonify
from truth import by_route, churn_one, keep_one

app = Flask(__name__)


@app.route("/keep/<int:n>")
def keep(n: int) -> str:
    for _ in range(n):
        keep_one()
    return "kept"


@app.route("/churn/<int:n>")
def churn(n: int) -> str:
    total = sum(churn_one() for _ in range(n))
    return str(total)


@app.route("/truth")
def truth():  # type: ignore[no-untyped-def]
    return jsonify(by_route())


if os.environ.get("ROUTES_OTEL_SDK") == "1":
    # As a service without opentelemetry-distro sets up tracing, after
    # opentelemetry-instrument started the agent: it hooks the provider at
    # its next cycle.
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())

if os.environ.get("ROUTES_MIDDLEWARE") == "1":
    from heapwatch.routes import WSGIMiddleware

    app.wsgi_app = WSGIMiddleware(app.wsgi_app)  # type: ignore[method-assign]
