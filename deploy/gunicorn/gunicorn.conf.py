"""gunicorn settings for a service watched by heapwatch.

    HEAPWATCH_ENABLED=1 HEAPWATCH_HOST=0.0.0.0 HEAPWATCH_PORT_RANGE=8 \\
        gunicorn -c deploy/gunicorn/gunicorn.conf.py myservice.wsgi:application

How heapwatch and gunicorn fit together:

* With HEAPWATCH_ENABLED=1 in its environment, the gunicorn master starts the
  heapwatch agent as the interpreter starts (heapwatch's auto-start hook), or
  at the latest in ``on_starting`` below, and serves /metrics on
  HEAPWATCH_PORT (9438).
* gunicorn forks the workers.  heapwatch restarts the agent in a forked
  child once its first cycle is due (a child that execs or exits sooner never
  starts one); ``post_fork`` below starts it at once in each worker, which
  lives on: a fresh baseline and its own /metrics on the next free port of
  the range: 9439, 9440, ...
* A worker that gunicorn replaces (max_requests, timeout) frees its port when
  it exits; the new worker takes the lowest free port, usually the same one.

So a master and N workers serve HEAPWATCH_PORT to HEAPWATCH_PORT + N.  Keep
HEAPWATCH_PORT_RANGE at the number of ports Prometheus scrapes (8 in
deploy/prometheus/prometheus.yml and deploy/kubernetes/): a process that finds
every port of its range taken logs a warning and serves nothing, rather than
serving where nobody scrapes.  ``on_starting`` warns when workers + 1 does not
fit.

Every setting can be overridden from the environment (GUNICORN_BIND,
GUNICORN_WORKERS, ...) or the command line.
"""

from __future__ import annotations

import os
from typing import Any

bind = os.environ.get("GUNICORN_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "4"))
worker_class = os.environ.get("GUNICORN_WORKER_CLASS", "sync")
threads = int(os.environ.get("GUNICORN_THREADS", "1"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
# Recycling workers bounds what a leak can cost; heapwatch still sees the
# leak, as growth that restarts from zero in each new worker.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "0"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "0"))
# preload_app imports the application in the master, before the fork: the
# memory it allocates then is traced with the line that allocated it, and
# shared copy-on-write by the workers.  Either way works with heapwatch.
preload_app = os.environ.get("GUNICORN_PRELOAD", "").lower() in ("1", "true", "yes", "on")
accesslog = os.environ.get("GUNICORN_ACCESSLOG", "-")


def on_starting(server: Any) -> None:
    """In the master, before any worker exists: make sure the agent runs
    (when the environment asks for it) and that the port range holds every
    process."""
    try:
        import heapwatch  # noqa: PLC0415 (heapwatch is optional: the service runs without it)
    except ImportError:
        server.log.info("heapwatch is not installed: no memory metrics")
        return
    agent = heapwatch.get_agent()
    if agent is None:
        # Not auto-started (the .pth hook did not run, e.g. heapwatch is on
        # PYTHONPATH rather than installed): start it from the environment.
        # It returns None, and logs why, when HEAPWATCH_ENABLED is not true.
        agent = heapwatch.start_agent()
    if agent is None:
        return
    needed = server.cfg.workers + 1
    if agent.config.port and agent.config.port_range < needed:
        server.log.warning(
            "heapwatch: HEAPWATCH_PORT_RANGE=%d ports cannot hold the master and %d "
            "workers; the workers past the range will serve no metrics",
            agent.config.port_range,
            server.cfg.workers,
        )
    server.log.info("heapwatch: master %s serves %s", os.getpid(), agent.metrics_url)


def post_fork(server: Any, worker: Any) -> None:
    """In each new worker: start its agent now (by itself it would start once
    the worker's first cycle is due) and say where its metrics are."""
    try:
        import heapwatch  # noqa: PLC0415 (heapwatch is optional: the service runs without it)
    except ImportError:
        return
    agent = heapwatch.get_agent()
    if agent is not None:
        agent.wake_in_child()
        server.log.info("heapwatch: worker %s serves %s", worker.pid, agent.metrics_url)
