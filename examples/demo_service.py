"""A small web service with one slow leak, for watching heapwatch at work.

It does not import heapwatch: the agent is switched on by environment
variables only (``make demo`` sets them), through the auto-start hook that
the installed package puts in site-packages.

Environment:
    DEMO_HOST         address the service listens on (default 127.0.0.1)
    DEMO_PORT         its port (default 8000; 0 for any free port)
    DEMO_RATE         requests per second its own client thread sends (default 20)
    DEMO_LEAK_BYTES   bytes leaked per /order request (default 4096)
    DEMO_SPIKE_BYTES  bytes an /export request holds for a moment (default 16 MiB)
    HEAPWATCH_*       the agent's settings (docs/design/agent.md), for example
                      HEAPWATCH_ENABLED=1 HEAPWATCH_INTERVAL=5 HEAPWATCH_PORT=9438

Endpoints: ``/`` (a page), ``/order`` (leaks DEMO_LEAK_BYTES into a cache
that is never evicted: see ``remember_order``), ``/report`` (allocates and
frees a few hundred KiB: churn, no leak), ``/export`` (holds DEMO_SPIKE_BYTES
while it answers, then frees them: a peak that no site's size shows, only
its share of the peak).  heapwatch's ``/metrics`` is served by the agent on
its own port.

Standard output, one line each, flushed as soon as known:
    demo service: http://HOST:PORT/
    heapwatch metrics: http://HOST:PORT/metrics     (or a note that the agent is off)
It runs until Ctrl-C (SIGINT) or SIGTERM, then exits with status 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

HOST = os.environ.get("DEMO_HOST", "127.0.0.1")
PORT = int(os.environ.get("DEMO_PORT", "8000"))
RATE = float(os.environ.get("DEMO_RATE", "20"))
LEAK_BYTES = int(os.environ.get("DEMO_LEAK_BYTES", "4096"))
SPIKE_BYTES = int(os.environ.get("DEMO_SPIKE_BYTES", str(16 << 20)))

# The leak: every order is remembered, and nothing ever forgets one.
_ORDERS: list[bytes] = []


def remember_order(order_id: int) -> None:
    _ORDERS.append(bytes(LEAK_BYTES))  # the leaking line


def build_export() -> bytes:
    buffer = bytes(SPIKE_BYTES)  # the spike's line
    return f"exported {len(buffer)} bytes\n".encode()


def build_report() -> bytes:
    rows = [{"id": i, "name": f"item-{i}", "price": i * 1.5} for i in range(2000)]  # churn
    return json.dumps({"rows": len(rows), "total": sum(r["price"] for r in rows)}).encode()


class Handler(BaseHTTPRequestHandler):
    counter = 0

    def do_GET(self) -> None:
        if self.path == "/order":
            Handler.counter += 1
            remember_order(Handler.counter)
            body = f"order {Handler.counter} taken\n".encode()
        elif self.path == "/report":
            body = build_report()
        elif self.path == "/export":
            body = build_export()
        elif self.path == "/":
            body = f"demo service: {len(_ORDERS)} orders remembered\n".encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def client(base_url: str, stop: threading.Event) -> None:
    """The service's own traffic: mostly orders, some reports, now and then an export."""
    period = 1.0 / RATE if RATE > 0 else 1.0
    n = 0
    while not stop.wait(period):
        n += 1
        path = "/export" if n % 50 == 0 else "/report" if n % 10 == 0 else "/order"
        try:
            with urllib.request.urlopen(base_url + path, timeout=5) as response:
                response.read()
        except OSError:
            pass


def heapwatch_metrics_url() -> str:
    """The agent's /metrics URL in this process.  heapwatch is not imported:
    if the auto-start hook loaded it, its URL (the port rule may have moved
    it past a busy HEAPWATCH_PORT) is read from the loaded module."""
    agent_module = sys.modules.get("heapwatch.agent.agent")
    agent = agent_module.get_agent() if agent_module is not None else None  # type: ignore[attr-defined]
    if agent is not None and agent.metrics_url:
        return str(agent.metrics_url)
    if agent is not None:
        return "not served (HEAPWATCH_EXPORTERS has no prometheus, or no free port)"
    return "agent off (run with HEAPWATCH_ENABLED=1, as make demo does)"


def main() -> int:
    # One long-lived thread serves the requests one at a time.
    server = HTTPServer((HOST, PORT), Handler)
    host, port = server.server_address[:2]
    base_url = f"http://{host}:{port}"
    stop = threading.Event()

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    threading.Thread(target=server.serve_forever, name="demo-http", daemon=True).start()
    threading.Thread(target=client, args=(base_url, stop), name="demo-client", daemon=True).start()
    print(f"demo service: {base_url}/", flush=True)
    print(f"heapwatch metrics: {heapwatch_metrics_url()}", flush=True)
    print("Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    stop.set()
    server.shutdown()
    server.server_close()
    print(f"demo service stopped ({len(_ORDERS)} orders remembered)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
