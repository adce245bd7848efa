"""The container's memory, read where the kernel keeps it: the memory cgroup.

The kernel's OOM killer acts when a cgroup's usage reaches its limit and
nothing more can be reclaimed; the kubelet evicts, and ``kubectl top`` shows,
by the *working set*: the usage less the inactive file pages, page cache the
kernel can drop at once (cAdvisor's figure, computed here the same way so the
two agree).  The agent publishes these each cycle, and a watcher polls the
usage to write its dump before the OOM killer acts.

What is read where (the constants below are the one home of the file names):

===========  ===================================  ===================================
figure       cgroup v2 (unified)                  cgroup v1 (memory controller)
===========  ===================================  ===================================
limit        ``memory.max``, the smallest from    ``memory.limit_in_bytes``, the same;
             the cgroup up to the mount point     and ``memory.stat``
                                                  ``hierarchical_memory_limit``
high         ``memory.high``, the same            (none)
usage        ``memory.current``                   ``memory.usage_in_bytes``
working set  usage - ``memory.stat``              usage - ``memory.stat``
             ``inactive_file``                    ``total_inactive_file``
OOM kills    ``memory.events`` ``oom_kill``       ``memory.oom_control`` ``oom_kill``
pressure     ``memory.pressure`` (PSI)            the unified hierarchy's
                                                  ``memory.pressure`` (hybrid hosts)
===========  ===================================  ===================================

The cgroup is found from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``,
as runc, the JDK and the Go runtime find it.  Every file is read by the C
core (``_core.read_small_file``), never with ``open()``: this code runs
unasked in the service's process, which may close descriptors 0 to 2 for a
moment and ``dup2()`` onto them (docs/design/guest.md).

Cost, measured with ``python -m timeit`` on the machine that wrote this
(cgroup v1 on a hybrid host, Linux 6.18, two shared cores, CPython 3.11):
``read_usage`` 9.6 us a call, of which the read itself (``read_small_file``
alone) is 8.7 us: ten a second is 0.01 % of a core.  ``read_working_set``
21 us, ``read_limit`` 48 us (v1: three ancestors and ``memory.stat``),
``read_container_memory`` 87 us (seven files), ``find_memory_cgroup`` 135 us,
once at start.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

__all__ = [
    "CGROUP_CONTROLLERS",
    "MEMORY_CURRENT",
    "MEMORY_EVENTS",
    "MEMORY_HIGH",
    "MEMORY_MAX",
    "MEMORY_PRESSURE",
    "MEMORY_STAT",
    "NO_LIMIT_FLOOR",
    "PROC_CGROUP",
    "PROC_MOUNTINFO",
    "V1_LIMIT",
    "V1_OOM_CONTROL",
    "V1_USAGE",
    "ContainerMemory",
    "MemoryCgroup",
    "find_memory_cgroup",
    "read_container_memory",
    "read_limit",
    "read_usage",
    "read_working_set",
]

# Relative to find_memory_cgroup's root.
PROC_CGROUP = "proc/self/cgroup"
PROC_MOUNTINFO = "proc/self/mountinfo"

# In a cgroup's directory, both versions.
MEMORY_STAT = "memory.stat"
MEMORY_PRESSURE = "memory.pressure"
# cgroup v2.
MEMORY_CURRENT = "memory.current"
MEMORY_MAX = "memory.max"
MEMORY_HIGH = "memory.high"
MEMORY_EVENTS = "memory.events"
CGROUP_CONTROLLERS = "cgroup.controllers"
# cgroup v1.
V1_USAGE = "memory.usage_in_bytes"
V1_LIMIT = "memory.limit_in_bytes"
V1_OOM_CONTROL = "memory.oom_control"

# v1 shows "no limit" as the largest signed 64-bit count of whole pages in
# bytes: 0x7FFFFFFFFFFFF000 with 4 KiB pages, 0x7FFFFFFFFFFF0000 with 64 KiB
# (arm64, ppc64le).  No machine has 4 EiB, so a value this large is no limit
# whatever the page size.
NO_LIMIT_FLOOR = 1 << 62

# memory.stat has some 40 lines in v1, 60 in v2, a few KB, and
# /proc/self/cgroup a line per hierarchy; mountinfo (read with SMALL_FILE_MAX)
# can be far longer in a container with many mounts.
_STAT_READ = 64 * 1024
_V2_INACTIVE_FILE = b"inactive_file"
_V1_INACTIVE_FILE = b"total_inactive_file"
_V1_HIERARCHICAL_LIMIT = b"hierarchical_memory_limit"
_OOM_KILL = b"oom_kill"
# mountinfo escapes space, tab, newline and backslash as \ooo.
_OCTAL_ESCAPE = re.compile(rb"\\([0-3][0-7]{2})")


class MemoryCgroup(NamedTuple):
    """Where the process's memory cgroup lives."""

    version: int
    """1 (the v1 memory controller) or 2 (the unified hierarchy)."""
    path: str
    """The process's memory cgroup directory."""
    ancestors: tuple[str, ...]
    """``path``, then each directory above it up to and including the mount
    point: where limits are looked for."""
    pressure: str | None
    """A ``memory.pressure`` file (PSI) for this cgroup, or None."""


class ContainerMemory(NamedTuple):
    """The cgroup's memory figures now; None where one cannot be read."""

    limit: int | None
    """Effective limit in bytes, the smallest on the path; None when none."""
    high: int | None
    """v2 ``memory.high``, the smallest on the path; None when none or v1."""
    usage: int | None
    """Bytes charged to the cgroup, page cache included."""
    working_set: int | None
    """Usage less inactive file pages, never below 0: the kubelet's figure."""
    oom_kills: int | None
    """Processes of the cgroup the OOM killer has killed."""
    pressure_some: float | None
    """Seconds in which some task waited for memory (PSI ``some total=``)."""
    pressure_full: float | None
    """Seconds in which every task waited for memory (PSI ``full total=``)."""


class _Mount(NamedTuple):
    root: str  # the directory of the hierarchy mounted (mountinfo's ROOT)
    point: str  # where, under find_memory_cgroup's root


def _read(path: str, limit: int = 4096) -> bytes:
    from heapwatch import _core  # noqa: PLC0415 (the C core: only when used)

    # Read by the core (csrc/descriptors.h): open() here could take a number
    # the service closed for a moment to dup2() onto it again.
    return _core.read_small_file(path, limit)


def _usage_file(cgroup: MemoryCgroup) -> str:
    return MEMORY_CURRENT if cgroup.version == 2 else V1_USAGE


def read_usage(cgroup: MemoryCgroup) -> int | None:
    """Bytes charged to the cgroup now (v2 ``memory.current``, v1
    ``memory.usage_in_bytes``); None when unreadable.

    The watcher calls this ten times a second for the life of the process:
    one small read and a parse, nothing else."""
    try:
        return int(_read(f"{cgroup.path}/{_usage_file(cgroup)}"))
    except (OSError, ValueError):
        return None


def _keyed(data: bytes, key: bytes, where: str) -> int:
    """The value of the ``key value`` line of a flat-keyed cgroup file."""
    for line in data.splitlines():
        name, _, value = line.partition(b" ")
        if name == key:
            return int(value)
    raise ValueError(f"{where} has no {key.decode()} line")


def _as_limit(value: int) -> int | None:
    return None if value >= NO_LIMIT_FLOOR else value


def _limit_value(data: bytes) -> int | None:
    """A limit file's value: a number, or v2's ``max`` for none."""
    text = data.strip()
    return None if text == b"max" else _as_limit(int(text))


def _smallest(values: list[int | None]) -> int | None:
    limits = [value for value in values if value is not None]
    return min(limits) if limits else None


def _smallest_on_path(cgroup: MemoryCgroup, name: str) -> int | None:
    # The v2 root has no memory.max, and a directory above a container's
    # cgroup may be unreadable: what cannot be read limits nothing.
    values: list[int | None] = []
    for directory in cgroup.ancestors:
        try:
            values.append(_limit_value(_read(f"{directory}/{name}")))
        except (OSError, ValueError):
            continue
    return _smallest(values)


def _read_stat(cgroup: MemoryCgroup) -> bytes | None:
    try:
        return _read(f"{cgroup.path}/{MEMORY_STAT}", _STAT_READ)
    except (OSError, ValueError):
        return None


def _limit(cgroup: MemoryCgroup, stat: bytes | None) -> int | None:
    if cgroup.version == 2:
        return _smallest_on_path(cgroup, MEMORY_MAX)
    # v1's hierarchical limit covers the ancestors a container cannot see
    # (its mount's root is its own cgroup).
    hierarchical: int | None = None
    if stat is not None:
        try:
            where = f"{cgroup.path}/{MEMORY_STAT}"
            hierarchical = _as_limit(_keyed(stat, _V1_HIERARCHICAL_LIMIT, where))
        except ValueError:
            pass
    return _smallest([_smallest_on_path(cgroup, V1_LIMIT), hierarchical])


def read_limit(cgroup: MemoryCgroup) -> int | None:
    """The effective limit in bytes now (limits can change): the smallest
    on the path; None when there is none."""
    return _limit(cgroup, _read_stat(cgroup) if cgroup.version == 1 else None)


def _working_set(cgroup: MemoryCgroup, usage: int | None, stat: bytes | None) -> int | None:
    if usage is None or stat is None:
        return None
    key = _V2_INACTIVE_FILE if cgroup.version == 2 else _V1_INACTIVE_FILE
    try:
        inactive = _keyed(stat, key, f"{cgroup.path}/{MEMORY_STAT}")
    except ValueError:
        return None
    # Inactive file pages and usage are not read at one instant; cAdvisor
    # also clamps at 0.
    return max(0, usage - inactive)


def read_working_set(cgroup: MemoryCgroup, usage: int) -> int | None:
    """``usage`` less the inactive file pages ``memory.stat`` shows now,
    never below 0; None when ``memory.stat`` cannot be read."""
    return _working_set(cgroup, usage, _read_stat(cgroup))


def _oom_kills(cgroup: MemoryCgroup) -> int | None:
    name = MEMORY_EVENTS if cgroup.version == 2 else V1_OOM_CONTROL
    path = f"{cgroup.path}/{name}"
    try:
        return _keyed(_read(path), _OOM_KILL, path)
    except (OSError, ValueError):
        return None


def _pressure_total(data: bytes, kind: bytes) -> float:
    """Seconds from a PSI line ``some avg10=0.00 ... total=<microseconds>``."""
    for line in data.splitlines():
        fields = line.split()
        if fields[:1] == [kind]:
            for field in fields[1:]:
                name, _, value = field.partition(b"=")
                if name == b"total":
                    return int(value) / 1e6
    raise ValueError(f"no {kind.decode()} total= in {data[:200]!r}")


def _pressure(cgroup: MemoryCgroup) -> tuple[float | None, float | None]:
    if cgroup.pressure is None:
        return None, None
    try:
        # Read even where PSI is off (psi=0): the file is there and reading
        # it fails (EOPNOTSUPP).
        data = _read(cgroup.pressure)
    except (OSError, ValueError):
        return None, None
    totals: list[float | None] = []
    for kind in (b"some", b"full"):
        try:
            totals.append(_pressure_total(data, kind))
        except ValueError:
            totals.append(None)
    return totals[0], totals[1]


def read_container_memory(cgroup: MemoryCgroup) -> ContainerMemory:
    """Every figure of the cgroup now; a file missing or garbled makes its
    figure None, never an exception."""
    usage = read_usage(cgroup)
    # Read right after the usage, which the working set is taken from.
    stat = _read_stat(cgroup)
    some, full = _pressure(cgroup)
    return ContainerMemory(
        limit=_limit(cgroup, stat),
        high=_smallest_on_path(cgroup, MEMORY_HIGH) if cgroup.version == 2 else None,
        usage=usage,
        working_set=_working_set(cgroup, usage, stat),
        oom_kills=_oom_kills(cgroup),
        pressure_some=some,
        pressure_full=full,
    )


# Finding the cgroup.


def _under(root: str, absolute: str) -> str:
    return os.path.normpath(os.path.join(root, absolute.lstrip("/")))


def _unescape(field: bytes) -> str:
    return os.fsdecode(_OCTAL_ESCAPE.sub(lambda m: bytes((int(m.group(1), 8),)), field))


def _own_paths(data: bytes) -> tuple[str | None, str | None]:
    """The process's v1 memory cgroup and v2 cgroup from /proc/self/cgroup
    (``hierarchy:controllers:path``)."""
    v1: str | None = None
    v2: str | None = None
    for line in data.splitlines():
        parts = line.split(b":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith(b"/"):
            continue
        hierarchy, controllers, path = parts
        if hierarchy == b"0" and not controllers:
            v2 = os.fsdecode(path)
        elif b"memory" in controllers.split(b","):
            v1 = os.fsdecode(path)
    return v1, v2


def _cgroup_mounts(data: bytes, root: str) -> tuple[list[_Mount], list[_Mount]]:
    """The v1 memory mounts and the cgroup2 mounts in mountinfo.

    A line: ``id parent major:minor ROOT MOUNTPOINT options [optional...] -
    FSTYPE SOURCE SUPEROPTIONS``."""
    v1: list[_Mount] = []
    v2: list[_Mount] = []
    for line in data.splitlines():
        fields = line.split(b" ")
        try:
            dash = fields.index(b"-", 6)
        except ValueError:
            continue
        if len(fields) < dash + 3:
            continue
        fstype = fields[dash + 1]
        superoptions = fields[dash + 3] if len(fields) > dash + 3 else b""
        mount = _Mount(_unescape(fields[3]), _under(root, _unescape(fields[4])))
        if fstype == b"cgroup" and b"memory" in superoptions.split(b","):
            v1.append(mount)
        elif fstype == b"cgroup2":
            v2.append(mount)
    return v1, v2


def _relative(path: str, mount_root: str) -> str | None:
    """``path`` below the mounted directory, or None when outside it."""
    # A process outside its cgroup namespace's root sees its path with "..":
    # what it names is not under any mount it can see.
    if ".." in path.split("/"):
        return None
    base = mount_root.rstrip("/")  # "" for "/": every path is under it
    if path == base:
        return ""
    if path.startswith(base + "/"):
        return path[len(base) + 1 :]
    return None


def _resolve(path: str, mounts: list[_Mount]) -> tuple[str, str]:
    """The directory of cgroup ``path`` and the mount point it is under."""
    for mount in mounts:
        relative = _relative(path, mount.root)
        if relative is None:
            continue
        directory = os.path.normpath(os.path.join(mount.point, relative))
        if os.path.isdir(directory):
            return directory, mount.point
    # Outside what is mounted (a container whose mount shows only its own
    # cgroup), or the directory is gone: the mount point is the nearest
    # thing to the process's cgroup it can see.
    return mounts[0].point, mounts[0].point


def _ancestors(directory: str, mount_point: str) -> tuple[str, ...]:
    chain = [directory]
    while directory != mount_point:
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
        chain.append(directory)
    return tuple(chain)


def _file_or_none(directory: str, name: str) -> str | None:
    path = f"{directory}/{name}"
    # stat() only: it opens no descriptor.
    return path if os.path.isfile(path) else None


def _has_memory_controller(directory: str, mount_point: str) -> bool:
    # The root cgroup has no memory.current; its cgroup.controllers says
    # whether the controller is on the unified hierarchy at all (on a
    # hybrid host it is not).
    if os.path.isfile(f"{directory}/{MEMORY_CURRENT}"):
        return True
    try:
        return b"memory" in _read(f"{mount_point}/{CGROUP_CONTROLLERS}").split()
    except (OSError, ValueError):
        return False


def find_memory_cgroup(root: str = "/") -> MemoryCgroup | None:
    """The process's memory cgroup, or None when it has none or it cannot
    be found (no /proc, no mount, unreadable files); never raises.

    ``root`` prefixes the /proc files and every mount point: "/" is this
    machine, a directory a fixture tree.  A v1 memory controller wins (on a
    hybrid host the unified hierarchy has no memory controller, only PSI)."""
    from heapwatch import _core  # noqa: PLC0415 (the C core: only when used)

    try:
        own = _read(_under(root, PROC_CGROUP), _STAT_READ)
        mountinfo = _read(_under(root, PROC_MOUNTINFO), _core.SMALL_FILE_MAX)
    except (OSError, ValueError):  # ValueError: a root with a NUL in it
        return None
    v1_path, v2_path = _own_paths(own)
    v1_mounts, v2_mounts = _cgroup_mounts(mountinfo, root)
    unified: tuple[str, str] | None = None
    if v2_path is not None and v2_mounts:
        unified = _resolve(v2_path, v2_mounts)
    if v1_path is not None and v1_mounts:
        directory, mount_point = _resolve(v1_path, v1_mounts)
        pressure = None
        # The unified root's pressure is the whole host's: the container's
        # only when the process's memory cgroup is the root too.
        if unified is not None and (unified[0] != unified[1] or directory == mount_point):
            pressure = _file_or_none(unified[0], MEMORY_PRESSURE)
        return MemoryCgroup(1, directory, _ancestors(directory, mount_point), pressure)
    if unified is not None and _has_memory_controller(*unified):
        directory, mount_point = unified
        pressure = _file_or_none(directory, MEMORY_PRESSURE)
        return MemoryCgroup(2, directory, _ancestors(directory, mount_point), pressure)
    return None
