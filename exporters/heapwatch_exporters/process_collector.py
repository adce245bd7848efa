"""``process_*``: the process's CPU, memory and descriptors, as
prometheus-client's ``ProcessCollector`` publishes them (same names, help,
types and values), read without a descriptor the service could see.

prometheus-client's collector opens ``/proc/self/stat``, ``limits`` and
``fd`` with ``open()`` and ``os.listdir()``, which release the GIL: run in
heapwatch's request thread, it took whatever number the service had just
closed, so a service that closes stdout for a moment and ``dup2()``s it back
(CPython's test_subprocess around a Popen) had its stdout replaced by our
file, or closed under it.  The core reads them with the GIL held instead
(``heapwatch._core.read_small_file``, ``count_dir_entries``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from heapwatch import _core

__all__ = ["ProcessCollector"]

PROC = "/proc"


class ProcessCollector(Collector):
    """``process_virtual_memory_bytes``, ``process_resident_memory_bytes``,
    ``process_start_time_seconds``, ``process_cpu_seconds_total``,
    ``process_open_fds`` and ``process_max_fds`` of this process; nothing
    where ``/proc`` cannot be read."""

    def __init__(self, registry: CollectorRegistry | None = None, proc: str = PROC) -> None:
        self._proc = proc
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._boot_time = self._read_boot_time()
        if registry is not None:
            registry.register(self)

    def _read_boot_time(self) -> float:
        try:
            # (a line per CPU comes before the boot time)
            stat = _core.read_small_file(os.path.join(self._proc, "stat"), _core.SMALL_FILE_MAX)
        except OSError:
            return 0.0
        for line in stat.splitlines():
            if line.startswith(b"btime "):
                return float(line.split()[1])
        return 0.0

    def collect(self) -> Iterator[Metric]:
        if not self._boot_time:
            return
        me = os.path.join(self._proc, "self")
        try:
            # Fields after the command, which may hold spaces and ")".
            fields = _core.read_small_file(os.path.join(me, "stat")).rpartition(b")")[2].split()
        except OSError:
            fields = []
        if len(fields) > 21:
            yield GaugeMetricFamily(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                value=float(fields[20]),
            )
            yield GaugeMetricFamily(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                value=float(fields[21]) * self._page_size,
            )
            yield GaugeMetricFamily(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                value=float(fields[19]) / self._ticks + self._boot_time,
            )
            yield CounterMetricFamily(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                # (summed as prometheus-client sums it: the same float)
                value=float(fields[11]) / self._ticks + float(fields[12]) / self._ticks,
            )
        try:
            limits = _core.read_small_file(os.path.join(me, "limits"))
            open_fds = _core.count_dir_entries(os.path.join(me, "fd"))
        except OSError:
            return
        for line in limits.splitlines():
            if line.startswith(b"Max open files"):
                yield GaugeMetricFamily(
                    "process_open_fds", "Number of open file descriptors.", value=float(open_fds)
                )
                yield GaugeMetricFamily(
                    "process_max_fds",
                    "Maximum number of open file descriptors.",
                    value=float(line.split()[3]),
                )
                break
