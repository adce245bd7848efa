"""The OpenTelemetry exporter: observable instruments on a meter named ``heapwatch``.

The instruments' callbacks read the agent's last cycle; they never take a
snapshot.  The MeterProvider is, in order: the one given in code, the one the
application configured globally, or else one heapwatch builds from the
standard ``OTEL_*`` variables (OTLP endpoint, protocol, headers, service name,
resource attributes, export interval and timeout).

heapwatch's own provider exports from a thread of its own, ``heapwatch-otlp``,
rather than the SDK's periodic reader thread: after ``fork()`` the child then
builds a fresh provider whose resource carries its own ``process.pid``,
instead of inheriting a reader that would keep exporting the child's figures
under the parent's identity.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from heapwatch._version import __version__
from heapwatch.agent.config import AgentConfig, env_value
from heapwatch.agent.interface import AgentView, Readings, ReadingsSource
from heapwatch.runtime.problems import ProblemLog
from heapwatch.runtime.threads import forget_dummy, join_thread, start_thread
from heapwatch_exporters._catalogue import (
    CATALOGUE,
    OTEL_ATTRIBUTE_FILE,
    OTEL_ATTRIBUTE_LINE,
)
from heapwatch_exporters._catalogue import Metric as CatalogueMetric
from heapwatch_exporters._resource import service_resource

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricReader

__all__ = ["OtelExporter", "build_meter_provider", "configured_meter_provider"]

log = logging.getLogger("heapwatch.otel")
problems = ProblemLog(log)


DEFAULT_EXPORT_INTERVAL_MS = 60000.0
DEFAULT_EXPORT_TIMEOUT_MS = 30000.0
PROTOCOLS = ("http/protobuf", "grpc")


class _Instruments:
    """heapwatch's instruments on one MeterProvider, fed by the attached agent.

    Made once per provider: an SDK asked for a second instrument of the same
    name returns the first, callbacks included, so a later agent re-points
    ``source`` instead of creating instruments again.
    """

    def __init__(self, provider: MeterProvider) -> None:
        self.source: ReadingsSource | None = None
        meter = provider.get_meter("heapwatch", __version__)
        for metric in CATALOGUE:
            if not metric.otel_name:
                continue
            create = (
                meter.create_observable_counter
                if metric.kind == "counter"
                else meter.create_observable_gauge
            )
            create(
                metric.otel_name,
                callbacks=[self._callback(metric)],
                unit=metric.otel_unit,
                description=metric.description,
            )

    def _readings(self) -> Readings | None:
        source = self.source
        return source() if source is not None else None

    def _callback(
        self, metric: CatalogueMetric
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            readings = self._readings()
            if readings is None:
                return []
            if metric.site_value is not None:
                if readings.result is None:
                    return []
                site_value = metric.site_value
                figures = ((site, site_value(site)) for site in readings.result.sites)
                return [
                    Observation(
                        figure, {OTEL_ATTRIBUTE_FILE: site.file, OTEL_ATTRIBUTE_LINE: site.line}
                    )
                    for site, figure in figures
                    if figure is not None
                ]
            if metric.series is not None:
                series = metric.series(readings) or {}
                names = metric.series_attributes or metric.series_labels
                return [
                    Observation(value, dict(zip(names, key)))  # type: ignore[arg-type]
                    for key, value in series.items()
                ]
            assert metric.value is not None
            value = metric.value(readings)
            return [] if value is None else [Observation(value)]

        return observe


_instruments: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_instruments_lock = threading.Lock()


def _instruments_for(provider: MeterProvider) -> _Instruments:
    with _instruments_lock:
        instruments = _instruments.get(provider)
        if instruments is None:
            instruments = _instruments[provider] = _Instruments(provider)
        return instruments


def configured_meter_provider() -> MeterProvider | None:
    """The application's global MeterProvider, or None if it set none."""
    provider = metrics.get_meter_provider()
    # Probed here, where it is asked: a private module of the API, which an
    # API without the proxy class lacks.
    try:
        from opentelemetry.metrics._internal import (  # noqa: PLC0415
            _ProxyMeterProvider,
        )
    except ImportError:  # pragma: no cover - an API without the proxy class
        from opentelemetry.sdk.metrics import (  # noqa: PLC0415
            MeterProvider as SdkMeterProvider,
        )

        return provider if isinstance(provider, SdkMeterProvider) else None
    return None if isinstance(provider, _ProxyMeterProvider) else provider


def _milliseconds(text: str) -> float:
    value = float(text)
    if not 0 < value < math.inf:
        raise ValueError
    return value


def _parse_ms(environ: Mapping[str, str], variable: str, default: float) -> float:
    text = environ.get(variable)
    if not text or not text.strip():
        return default

    def parse(text: str) -> float:
        try:
            return _milliseconds(text)
        except ValueError:
            raise ValueError("a positive number of milliseconds") from None

    return env_value(variable, text, parse, default)


def _protocol(environ: Mapping[str, str]) -> str:
    for variable in ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        text = environ.get(variable)
        if text and text.strip():

            def parse(text: str) -> str:
                protocol = text.strip().lower()
                if protocol not in PROTOCOLS:
                    raise ValueError(" or ".join(PROTOCOLS))
                return protocol

            return env_value(variable, text, parse, "http/protobuf")
    return "http/protobuf"


def _otlp_exporter(environ: Mapping[str, str]) -> Any:
    # The OTLP exporter of the protocol asked for, imported only then (grpc's
    # is an optional package; either costs start-up time).
    if _protocol(environ) == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
                OTLPMetricExporter as GrpcExporter,
            )
        except ImportError:
            log.warning(
                "OTLP protocol grpc needs opentelemetry-exporter-otlp-proto-grpc; "
                "using http/protobuf"
            )
        else:
            return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
        OTLPMetricExporter,
    )

    return OTLPMetricExporter()


def build_meter_provider(
    environ: Mapping[str, str] | None = None, exporter: Any = None
) -> tuple[MeterProvider, MetricReader]:
    """A MeterProvider from the standard ``OTEL_*`` variables, and its reader.

    The reader has no thread of its own (its interval is infinite): the
    caller collects with ``reader.collect()``.  The resource adds
    ``process.pid`` to what ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` give, so that the processes of a service
    (gunicorn workers, say) stay apart.
    """
    # The SDK only when heapwatch builds the provider itself.
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
        PeriodicExportingMetricReader,
    )

    env = os.environ if environ is None else environ
    if exporter is None:
        exporter = _otlp_exporter(env)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=math.inf)
    resource = service_resource()
    # The agent shuts the provider down (after its last cycle), not the SDK's
    # own exit hook, which would run first.
    provider = SdkMeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
    return provider, reader


class _OurRecords(logging.Filter):
    """What the OpenTelemetry SDK logs while working for heapwatch (in the
    export thread, or in the thread shutting heapwatch's provider down)
    becomes one line per distinct problem on ``heapwatch.otel``, rate-limited,
    without the SDK's tracebacks; its records from any other thread (the
    application's own exporters) pass untouched."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()
        self.quiet: set[int] = set()
        """Threads heapwatch interrupted on purpose: what the SDK says of
        that (aborted retries) is no news, and goes to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread not in self.threads:
            return True
        if record.thread in self.quiet:
            log.debug("OpenTelemetry SDK, stopping: %s", record.getMessage())
            return False
        problems.report(
            f"sdk:{record.name}:{record.msg}",
            "heapwatch OpenTelemetry export: %s",
            record.getMessage(),
            level=record.levelno,
            exc_info=record.exc_info,
        )
        return False


_our_records = _OurRecords()
_filtered_loggers: set[str] = set()


def _route_sdk_records(*objects: object) -> None:
    """Puts ``_our_records`` on the loggers of the modules the classes of
    ``objects`` (and their bases) come from: the SDK logs on module loggers."""
    for obj in objects:
        for cls in type(obj).__mro__:
            module = cls.__module__
            if module.startswith("opentelemetry") and module not in _filtered_loggers:
                _filtered_loggers.add(module)
                logging.getLogger(module).addFilter(_our_records)


class _ExportThread:
    """Collects and exports every interval, then once more when stopped."""

    def __init__(self, reader: MetricReader, interval: float, timeout_ms: float) -> None:
        self._reader = reader
        self._interval = interval
        self._timeout_ms = timeout_ms
        self._stop = threading.Event()
        self._paused = False
        self._next = time.monotonic() + interval
        self._thread = start_thread(self._run, "heapwatch-otlp", (self._stop,))
        self.ident = self._thread.ident

    def _export(self) -> None:
        try:
            self._reader.collect(timeout_millis=self._timeout_ms)
        except Exception as exc:
            problems.report(
                f"collect:{type(exc).__name__}",
                "heapwatch OpenTelemetry export failed (retried every interval): %r",
                exc,
                exc_info=exc,
            )

    def _run(self, stop: threading.Event) -> None:
        me = threading.get_ident()
        _our_records.threads.add(me)
        try:
            # On a schedule of its own, which a pause for a fork keeps.
            while not stop.wait(max(0.0, self._next - time.monotonic())):
                self._next = time.monotonic() + self._interval
                self._export()
                forget_dummy()  # a record the SDK logged named this thread
            if not self._paused:
                self._export()
        finally:
            # A thread's number is reused by the next thread to start.
            _our_records.threads.discard(me)
            _our_records.quiet.discard(me)

    def stop(self, timeout: float) -> bool:
        self._stop.set()
        return self.join(timeout)

    def pause(self, deadline: float) -> bool:
        """Ends the thread for a fork, with no export, by the monotonic
        ``deadline`` (an export in flight is waited for until then)."""
        if self._thread.is_current():
            return False
        self._paused = True
        self._stop.set()
        return join_thread(self._thread, deadline)

    def resume(self) -> None:
        """Exports again, on the same schedule, after ``pause``."""
        if not self._paused:
            return
        self._paused = False
        self._stop = threading.Event()
        # A thread that outlived pause() sees its own event set and returns.
        self._thread = start_thread(self._run, "heapwatch-otlp", (self._stop,))
        self.ident = self._thread.ident

    def join(self, timeout: float) -> bool:
        if not self._thread.is_current():
            self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()


class OtelExporter:
    """Publishes the agent's readings as OpenTelemetry observable instruments.

    Args:
        meter_provider: the provider to use; by default the application's,
            else one built from ``OTEL_*`` (``build_meter_provider``).
        environ: the environment to read ``OTEL_*`` from.
        otlp_exporter: the exporter of a provider heapwatch builds (tests).
    """

    name = "otlp"
    pushes = True
    """Its reader exports the last readings at shutdown: the agent runs a
    last cycle for it at the process's exit."""

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        otlp_exporter: Any = None,
    ) -> None:
        self._given = meter_provider
        self._environ = environ
        self._otlp_exporter = otlp_exporter
        self._instruments: _Instruments | None = None
        self._source: ReadingsSource | None = None
        self._own: tuple[MetricReader, _ExportThread] | None = None
        self.meter_provider: MeterProvider | None = None

    @classmethod
    def from_config(
        cls, config: AgentConfig, *, meter_provider: MeterProvider | None = None
    ) -> OtelExporter:
        """The exporter the agent builds for ``HEAPWATCH_EXPORTERS=otlp`` (the
        entry point ``heapwatch.exporters: otlp``)."""
        return cls(meter_provider=meter_provider)

    def start(self, agent: AgentView) -> None:
        env = os.environ if self._environ is None else self._environ
        provider = self._given if self._given is not None else configured_meter_provider()
        if provider is None:
            if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
                log.info("OTEL_SDK_DISABLED is true: heapwatch exports no OpenTelemetry metrics")
                return
            provider, reader = build_meter_provider(env, self._otlp_exporter)
            _route_sdk_records(provider, reader, getattr(reader, "_exporter", None))
            interval = _parse_ms(env, "OTEL_METRIC_EXPORT_INTERVAL", DEFAULT_EXPORT_INTERVAL_MS)
            timeout = _parse_ms(env, "OTEL_METRIC_EXPORT_TIMEOUT", DEFAULT_EXPORT_TIMEOUT_MS)
            self._own = (reader, _ExportThread(reader, interval / 1000.0, timeout))
        self.meter_provider = provider
        self._source = agent.readings
        self._instruments = _instruments_for(provider)
        self._instruments.source = self._source

    def _detach(self) -> None:
        instruments, self._instruments = self._instruments, None
        if instruments is not None and instruments.source is self._source:
            instruments.source = None

    def shutdown(self, timeout: float) -> None:
        own, self._own = self._own, None
        if own is not None:
            reader, thread = own
            deadline = _Deadline(timeout)
            # Its last export carries the last cycle, if it can within the
            # deadline; else it is retrying (the collector is down), and the
            # reader's shutdown ends the retries: a thread left retrying would
            # keep a process that ends when its last thread does (a child
            # forked from a thread) alive.  Not the provider's shutdown: that
            # does nothing once the deadline has passed.
            finished = thread.stop(deadline.remaining())
            me = threading.get_ident()
            ours = me in _our_records.threads
            _our_records.threads.add(me)
            if thread.ident is not None:
                _our_records.quiet.add(thread.ident)
            try:
                reader.shutdown(timeout_millis=max(deadline.remaining(), 0.5) * 1000.0)
            except Exception as exc:
                problems.report(
                    "shutdown",
                    "heapwatch OpenTelemetry: the exporter did not shut down: %s",
                    " ".join(str(exc).split()),
                    exc_info=exc,
                )
            finally:
                if not ours:
                    _our_records.threads.discard(me)
            if not thread.join(0.5) or not finished:
                log.debug("heapwatch OpenTelemetry: the last export did not finish in time")
        self._detach()
        self.meter_provider = None

    def pause_for_fork(self, deadline: float) -> bool:
        own = self._own
        return own[1].pause(deadline) if own is not None else True

    def resume_after_fork(self) -> None:
        own = self._own
        if own is not None:
            own[1].resume()

    def after_fork_in_child(self) -> None:
        # The parent's provider (resource with its pid) is dropped without
        # shutting it down: that would export from the child.  No thread of
        # it runs in the child.  An application's provider is the
        # application's to handle; the instruments stay on it.
        if self._own is not None:
            self._own = None
            _our_records.threads.clear()  # numbers of the parent's threads
            _our_records.quiet.clear()
            self._detach()
            self.meter_provider = None


class _Deadline:
    def __init__(self, timeout: float) -> None:
        self._end = time.monotonic() + max(0.0, timeout)

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())
