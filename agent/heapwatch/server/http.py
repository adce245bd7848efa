"""The agent's HTTP endpoint: the router (``heapwatch.server.router``) served from a
daemon thread.

The server is wsgiref's, threaded per request, bound to 127.0.0.1 unless told
otherwise, and it never resolves names while binding.  This module imports
``http.server`` and the email package (some 30 ms): the agent imports it only
when it has routes to serve.

Port rule: the server tries ``port``, ``port + 1``, ... up to ``port_range``
ports and keeps the first it can bind, so that every process of a service
(gunicorn workers, forked or spawned children, which inherit the same
``HEAPWATCH_PORT``) gets its own endpoint.  Port 0 asks the kernel for any
free port.  The port kept is logged.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import selectors
import socket
import sys
import threading
from socketserver import TCPServer
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from heapwatch import _core
from heapwatch.runtime.problems import ProblemLog
from heapwatch.runtime.threads import OwnThread, forget_dummy, join_thread, start_thread
from heapwatch.server.router import Router

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

__all__ = ["Server"]

log = logging.getLogger("heapwatch.server")
problems = ProblemLog(log)


class _LogStream:
    """wsgi.errors: what wsgiref would print to stderr goes to the log."""

    def write(self, text: str) -> int:
        if text.strip():
            log.debug("%s", text.rstrip())
        return len(text)

    def flush(self) -> None:
        pass


class _Handler(WSGIRequestHandler):
    timeout = 30  # seconds a client may take to send its request: no thread held forever

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def get_stderr(self) -> Any:
        return _LogStream()


class _HTTPServer(WSGIServer):
    """wsgiref's server, a thread per request (heapwatch's: signals blocked),
    that can abort the requests in flight when it stops."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The requests in flight and the thread serving each.
        self._requests: dict[socket.socket, OwnThread | None] = {}
        self._requests_lock = threading.Lock()  # guards _requests
        super().__init__(*args, **kwargs)

    def server_activate(self) -> None:
        super().server_activate()
        # get_request() accepts with the GIL held, where it may not wait.
        self.socket.setblocking(False)

    def get_request(self) -> tuple[socket.socket, Any]:
        # Accepted by the core (csrc/descriptors.h), never at a number the
        # service closed for a moment to dup2() onto it again: our answer
        # then went to its stdout, and our close() closed it.
        fd = _core.accept(self.socket.fileno())
        conn = socket.socket(self.socket.family, self.socket.type, self.socket.proto, fileno=fd)
        try:
            return conn, conn.getpeername()
        except OSError:
            conn.close()
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._requests_lock:
            self._requests[request] = None
            # Under the lock: the thread may end (and discard) before it is noted.
            thread = start_thread(
                self._serve_request, "heapwatch-http-request", (request, client_address)
            )
            if request in self._requests:
                self._requests[request] = thread

    def join_requests(self, deadline: float) -> bool:
        """Waits for the requests in flight to end, until the monotonic
        ``deadline``; whether they did."""
        with self._requests_lock:
            threads = [thread for thread in self._requests.values() if thread is not None]
        return all([join_thread(thread, deadline) for thread in threads])

    def _serve_request(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver would print the traceback to the service's stderr.
        exc = sys.exc_info()[1]
        peer = client_address[0] if isinstance(client_address, tuple) else client_address
        if isinstance(exc, (socket.timeout, TimeoutError)):
            problems.report(
                "http-timeout",
                "heapwatch HTTP: a client at %s sent no complete request within %gs; "
                "its connection was closed",
                peer,
                _Handler.timeout,
            )
        elif isinstance(exc, ConnectionError):
            problems.report(
                "http-disconnect",
                "heapwatch HTTP: a client at %s left before its answer was sent (%s)",
                peer,
                exc,
                level=logging.INFO,
            )
        else:
            problems.report(
                f"http-error:{type(exc).__name__}",
                "heapwatch HTTP: a request from %s failed: %r",
                peer,
                exc,
                level=logging.ERROR,
                exc_info=exc,
            )

    def shutdown_request(self, request: Any) -> None:
        with self._requests_lock:
            self._requests.pop(request, None)
        super().shutdown_request(request)

    def abort_requests(self) -> None:
        """Ends the requests in flight (their threads see their socket shut)."""
        with self._requests_lock:
            requests = list(self._requests)
        for request in requests:
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)

    def forget_requests(self) -> None:
        """In a forked child: closes the parent's connections, never shuts them."""
        # A thread of the parent may have held the lock: the child's is new.
        self._requests_lock = threading.Lock()
        requests, self._requests = list(self._requests), {}
        for request in requests:
            with contextlib.suppress(OSError):
                request.close()

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup
        # that can take seconds; the agent binds while the service starts.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)
        self.setup_environ()


def _family(host: str) -> socket.AddressFamily:
    try:
        infos = socket.getaddrinfo(
            host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST
        )
    except socket.gaierror:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


def _server_class(family: socket.AddressFamily) -> type[_HTTPServer]:
    if family == socket.AF_INET6:

        class _HTTPServer6(_HTTPServer):
            address_family = socket.AF_INET6

        return _HTTPServer6
    return _HTTPServer


class Server:
    """Serves a WSGI application on the first free port of a bounded range.

    ``start`` binds synchronously (so the port is known when it returns) and
    serves from a daemon thread named ``heapwatch-http``; ``stop`` is
    idempotent and bounded by its timeout; ``close_in_child`` drops what a
    forked child inherited without touching the parent's socket.
    """

    def __init__(
        self, app: WSGIApplication, host: str = "127.0.0.1", port: int = 0, port_range: int = 1
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.port_range = max(1, port_range) if port else 1
        self._httpd: _HTTPServer | None = None
        self._thread: OwnThread | None = None
        self._wake: tuple[int, int] | None = None

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) being served, or None."""
        if self._httpd is None:
            return None
        return self.host, self._httpd.server_port

    @property
    def url(self) -> str | None:
        address = self.address
        if address is None:
            return None
        host = f"[{address[0]}]" if ":" in address[0] else address[0]
        return f"http://{host}:{address[1]}"

    def start(self) -> bool:
        """Binds and starts serving; False (with a warning logged) when no
        port of the range could be bound."""
        if self._httpd is not None:
            return True
        httpd = self._bind()
        if httpd is None:
            return False
        httpd.set_app(self.app)
        self._httpd = httpd
        _warn_if_exposed(str(httpd.server_address[0]), self.url or "", self.app)
        self._wake = os.pipe()
        self._thread = start_thread(self._serve, "heapwatch-http", (httpd, self._wake[0]))
        return True

    def _bind(self) -> _HTTPServer | None:
        try:
            cls = _server_class(_family(self.host))
        except OSError as exc:
            log.warning("heapwatch cannot serve on host %r: %s", self.host, exc)
            return None
        last = self.port + self.port_range - 1
        for port in range(self.port, min(last, 65535) + 1):
            try:
                return cls((self.host, port), _Handler)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE and port < last:
                    continue
                if exc.errno == errno.EADDRINUSE:
                    log.warning(
                        "heapwatch cannot serve metrics: ports %d to %d on %s are all in use "
                        "(raise HEAPWATCH_PORT_RANGE or set HEAPWATCH_PORT=0)",
                        self.port,
                        last,
                        self.host,
                    )
                else:
                    log.warning(
                        "heapwatch cannot serve metrics on %s port %d: %s", self.host, port, exc
                    )
                return None
        return None

    @staticmethod
    def _serve(httpd: _HTTPServer, wake: int) -> None:
        # A selector on the listening socket and a wake-up pipe: stop() returns
        # as soon as it writes to the pipe, with no polling interval to wait out.
        # The pipe's read end is this thread's to close: closed by stop() while
        # this thread was not yet in select(), it would leave it waiting on an
        # empty selector for ever (and a process that ends with its last
        # thread alive; seen when an exporter's shutdown used the deadline up).
        httpd.timeout = 1.0
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(httpd, selectors.EVENT_READ)
                selector.register(wake, selectors.EVENT_READ)
                while True:
                    events = selector.select()
                    if any(key.fileobj == wake for key, _ in events):
                        return
                    try:
                        httpd.handle_request()
                    except Exception:  # the socket closed by stop(), for one
                        log.debug("heapwatch HTTP server error", exc_info=True)
                    forget_dummy()
        finally:
            with contextlib.suppress(OSError):
                os.close(wake)

    def stop(self, timeout: float = 5.0) -> bool:
        """Stops serving and closes the socket; True if the thread ended in time."""
        httpd, thread, wake = self._httpd, self._thread, self._wake
        self._httpd = self._thread = self._wake = None
        if httpd is None:
            return True
        ended = True
        if wake is not None:
            with contextlib.suppress(OSError):
                os.write(wake[1], b"x")
        if thread is not None and not thread.is_current():
            thread.join(max(0.0, timeout))
            ended = not thread.is_alive()
        httpd.server_close()
        httpd.abort_requests()
        if wake is not None:
            # The read end is the serving thread's (it closes it on its way out).
            with contextlib.suppress(OSError):
                os.close(wake[1])
        return ended

    def pause(self, deadline: float) -> bool:
        """Stops serving for a fork, by the monotonic ``deadline``, and
        waits for the requests in flight; the socket keeps listening, and
        connections made meanwhile wait in its backlog for ``resume``.
        Whether every thread of the server ended in time."""
        thread, wake = self._thread, self._wake
        httpd = self._httpd
        if httpd is None or thread is None or wake is None:
            return True
        if thread.is_current():  # a fork from a request's thread
            return False
        self._thread = self._wake = None
        with contextlib.suppress(OSError):
            os.write(wake[1], b"x")
        ended = join_thread(thread, deadline)
        with contextlib.suppress(OSError):
            os.close(wake[1])  # (the read end is the serving thread's)
        if not ended:
            # Left running: it stops at its next wake-up, or with the process.
            return False
        return httpd.join_requests(deadline)

    def resume(self) -> None:
        """Serves again after ``pause``."""
        httpd = self._httpd
        if httpd is None or self._thread is not None:
            return
        self._wake = os.pipe()
        self._thread = start_thread(self._serve, "heapwatch-http", (httpd, self._wake[0]))

    def close_in_child(self) -> None:
        """In a forked child: closes the inherited descriptors; the parent's
        socket keeps listening (close, never shutdown, on a shared socket)."""
        httpd, wake = self._httpd, self._wake
        self._httpd = self._thread = self._wake = None
        if httpd is not None:
            httpd.socket.close()
            httpd.forget_requests()
        for fd in wake or ():
            with contextlib.suppress(OSError):
                os.close(fd)


def _warn_if_exposed(bound: str, url: str, app: object) -> None:
    """Warns when the endpoint is reachable from beyond this host; louder
    when it serves the token-protected ``/debug/`` routes there."""
    try:
        if ipaddress.ip_address(bound.split("%", maxsplit=1)[0]).is_loopback:
            return
    except ValueError:
        pass
    router = app if isinstance(app, Router) else None
    debug_open = router is not None and bool(router.token) and router.protected_paths()
    if debug_open:
        log.error(
            "heapwatch serves /debug/ (memory dumps, profiles) and /metrics on %s, beyond "
            "loopback, over plain HTTP: the bearer token travels in clear and /metrics "
            "needs none; bind HEAPWATCH_HOST=127.0.0.1, or put TLS and a firewall in front",
            url,
        )
    else:
        log.warning(
            "heapwatch serves /metrics on %s, beyond loopback, without authentication: "
            "whoever reaches the port reads the service's allocation sites; bind "
            "HEAPWATCH_HOST=127.0.0.1 unless a scraper on another host needs it",
            url,
        )
