"""The container's memory from its cgroup, on fixture trees laid out per test."""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path
from typing import Any

import pytest

from heapwatch import _core
from heapwatch.runtime.container import (
    NO_LIMIT_FLOOR,
    ContainerMemory,
    MemoryCgroup,
    find_memory_cgroup,
    read_container_memory,
    read_limit,
    read_usage,
    read_working_set,
)

V1_NO_LIMIT_4K = 9223372036854771712  # 0x7FFFFFFFFFFFF000
V1_NO_LIMIT_64K = 0x7FFFFFFFFFFF0000
GIB = 1 << 30
MIB = 1 << 20

# What this machine's kernel writes, the numbers changed.
PSI = (
    "some avg10=0.12 avg60=0.05 avg300=0.01 total=1500000\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=250000\n"
)
V2_EVENTS = "low 0\nhigh 12\nmax 7\noom 2\noom_kill 1\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
# The unified hierarchy of a hybrid host, as this machine mounts it.
HYBRID_UNIFIED = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw"


def mount(root: str, point: str, fstype: str, superoptions: str = "rw") -> str:
    """A mountinfo line, with an optional field as the kernel writes them."""
    return f"35 31 0:32 {root} {point} rw,nosuid,nodev shared:13 - {fstype} {fstype} {superoptions}"


def v1_stat(inactive_file: int, hierarchical_limit: int = V1_NO_LIMIT_4K) -> str:
    # inactive_file (this cgroup alone) differs from total_inactive_file
    # (with its children) so that a test sees which one is read.
    return (
        "cache 4096\nrss 8192\ninactive_file 1\nactive_file 2\n"
        f"hierarchical_memory_limit {hierarchical_limit}\n"
        f"hierarchical_memsw_limit {V1_NO_LIMIT_4K}\n"
        "total_cache 4096\ntotal_rss 8192\n"
        f"total_inactive_file {inactive_file}\ntotal_active_file 2\n"
    )


def v2_stat(inactive_file: int) -> str:
    return f"anon 8192\nfile 4096\nactive_anon 0\ninactive_file {inactive_file}\nactive_file 5\n"


def lay_out(tmp_path: Path, cgroup: str, mounts: list[str], files: dict[str, str]) -> str:
    """A machine in ``tmp_path``: /proc/self/cgroup, /proc/self/mountinfo and
    ``files`` (paths relative to the root); returns the root."""
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("".join(line + "\n" for line in mounts))
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def v2_in_namespace(tmp_path: Path, **changed: str) -> str:
    """cgroup v2 in a container with its own cgroup namespace: the process is
    at "/" and the mount shows the container's cgroup."""
    files = {
        "cgroup.controllers": "cpu io memory pids",
        "memory.current": str(100 * MIB),
        "memory.max": str(256 * MIB),
        "memory.high": str(200 * MIB),
        "memory.stat": v2_stat(30 * MIB),
        "memory.events": V2_EVENTS,
        "memory.pressure": PSI,
    }
    files.update(changed)
    return lay_out(
        tmp_path,
        "0::/\n",
        [mount("/", "/sys/fs/cgroup", "cgroup2", "rw,nsdelegate")],
        {f"sys/fs/cgroup/{name}": text for name, text in files.items()},
    )


def v2_kubepods(tmp_path: Path, ctr_max: str, pod_max: str, kubepods_max: str) -> str:
    """cgroup v2 on a host: the process in /kubepods/pod1/ctr."""
    base = "sys/fs/cgroup"
    return lay_out(
        tmp_path,
        "0::/kubepods/pod1/ctr\n",
        [mount("/", "/sys/fs/cgroup", "cgroup2")],
        {
            f"{base}/cgroup.controllers": "cpu memory",
            f"{base}/kubepods/memory.max": kubepods_max,
            f"{base}/kubepods/memory.high": "max",
            f"{base}/kubepods/pod1/memory.max": pod_max,
            f"{base}/kubepods/pod1/memory.high": str(400 * MIB),
            f"{base}/kubepods/pod1/ctr/memory.max": ctr_max,
            f"{base}/kubepods/pod1/ctr/memory.high": "max",
            f"{base}/kubepods/pod1/ctr/memory.current": str(50 * MIB),
        },
    )


def v1_docker(tmp_path: Path, mount_root: str, stat: str, limit: str = str(GIB)) -> str:
    """cgroup v1, the process in /docker/abc; ``limit`` on its own cgroup."""
    base = "sys/fs/cgroup/memory"
    own = base if mount_root == "/docker/abc" else f"{base}/docker/abc"
    files = {
        f"{own}/memory.limit_in_bytes": limit,
        f"{own}/memory.usage_in_bytes": str(300 * MIB),
        f"{own}/memory.stat": stat,
        f"{own}/memory.oom_control": V1_OOM_CONTROL,
    }
    if mount_root == "/":
        files[f"{base}/docker/memory.limit_in_bytes"] = str(V1_NO_LIMIT_4K)
        files[f"{base}/memory.limit_in_bytes"] = str(V1_NO_LIMIT_4K)
    return lay_out(
        tmp_path,
        "5:devices:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n",
        [
            mount(mount_root, "/sys/fs/cgroup/devices", "cgroup", "rw,devices"),
            mount(mount_root, "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
        ],
        files,
    )


# cgroup v2


def test_v2_in_a_cgroup_namespace_reads_every_figure(tmp_path: Path) -> None:
    root = v2_in_namespace(tmp_path)

    cgroup = find_memory_cgroup(root)

    directory = f"{root}/sys/fs/cgroup"
    assert cgroup == MemoryCgroup(2, directory, (directory,), f"{directory}/memory.pressure")
    assert read_container_memory(cgroup) == ContainerMemory(
        limit=256 * MIB,
        high=200 * MIB,
        usage=100 * MIB,
        working_set=70 * MIB,
        oom_kills=1,
        pressure_some=1.5,
        pressure_full=0.25,
    )
    assert read_usage(cgroup) == 100 * MIB
    assert read_limit(cgroup) == 256 * MIB
    assert read_working_set(cgroup, 90 * MIB) == 60 * MIB


def test_v2_limit_set_on_an_ancestor_is_the_effective_limit(tmp_path: Path) -> None:
    root = v2_kubepods(tmp_path, ctr_max="max", pod_max=str(512 * MIB), kubepods_max="max")

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    base = f"{root}/sys/fs/cgroup"
    assert cgroup.version == 2
    assert cgroup.path == f"{base}/kubepods/pod1/ctr"
    assert cgroup.ancestors == (
        f"{base}/kubepods/pod1/ctr",
        f"{base}/kubepods/pod1",
        f"{base}/kubepods",
        base,
    )
    memory = read_container_memory(cgroup)
    assert (memory.limit, memory.high, memory.usage) == (512 * MIB, 400 * MIB, 50 * MIB)
    assert read_limit(cgroup) == 512 * MIB


def test_v2_smaller_limit_below_the_pod_wins(tmp_path: Path) -> None:
    root = v2_kubepods(
        tmp_path, ctr_max=str(128 * MIB), pod_max=str(512 * MIB), kubepods_max=str(GIB)
    )

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    assert read_limit(cgroup) == 128 * MIB
    assert read_container_memory(cgroup).limit == 128 * MIB


def test_v2_limit_changed_is_seen_by_the_next_read(tmp_path: Path) -> None:
    root = v2_kubepods(tmp_path, ctr_max="max", pod_max=str(512 * MIB), kubepods_max="max")
    cgroup = find_memory_cgroup(root)
    assert cgroup is not None

    Path(cgroup.path, "memory.max").write_text(str(64 * MIB))

    assert read_limit(cgroup) == 64 * MIB


def test_v2_max_everywhere_is_no_limit(tmp_path: Path) -> None:
    root = v2_kubepods(tmp_path, ctr_max="max\n", pod_max="max\n", kubepods_max="max\n")

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    assert read_limit(cgroup) is None
    assert read_container_memory(cgroup).limit is None


def test_v2_root_cgroup_on_a_plain_host_has_no_limit_and_raises_nothing(tmp_path: Path) -> None:
    # The root cgroup has no memory.current, memory.max nor memory.high.
    root = lay_out(
        tmp_path,
        "0::/\n",
        [mount("/", "/sys/fs/cgroup", "cgroup2")],
        {
            "sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory hugetlb pids",
            "sys/fs/cgroup/memory.stat": v2_stat(MIB),
            "sys/fs/cgroup/memory.pressure": PSI,
        },
    )

    cgroup = find_memory_cgroup(root)

    directory = f"{root}/sys/fs/cgroup"
    assert cgroup == MemoryCgroup(2, directory, (directory,), f"{directory}/memory.pressure")
    assert read_container_memory(cgroup) == ContainerMemory(
        None, None, None, None, None, pressure_some=1.5, pressure_full=0.25
    )
    assert read_limit(cgroup) is None


def test_v2_without_the_memory_controller_is_no_memory_cgroup(tmp_path: Path) -> None:
    root = lay_out(
        tmp_path,
        "0::/\n",
        [mount("/", "/sys/fs/cgroup", "cgroup2")],
        {"sys/fs/cgroup/cgroup.controllers": "cpu io pids", "sys/fs/cgroup/memory.pressure": PSI},
    )

    assert find_memory_cgroup(root) is None


# cgroup v1


def test_v1_mount_root_is_the_containers_cgroup(tmp_path: Path) -> None:
    root = v1_docker(tmp_path, "/docker/abc", v1_stat(inactive_file=100 * MIB))

    cgroup = find_memory_cgroup(root)

    directory = f"{root}/sys/fs/cgroup/memory"
    assert cgroup == MemoryCgroup(1, directory, (directory,), None)
    assert read_container_memory(cgroup) == ContainerMemory(
        limit=GIB,
        high=None,
        usage=300 * MIB,
        working_set=200 * MIB,
        oom_kills=3,
        pressure_some=None,
        pressure_full=None,
    )
    assert read_usage(cgroup) == 300 * MIB
    assert read_working_set(cgroup, 150 * MIB) == 50 * MIB


def test_v1_mount_root_slash_walks_up_to_the_mount_point(tmp_path: Path) -> None:
    root = v1_docker(tmp_path, "/", v1_stat(inactive_file=100 * MIB))

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    base = f"{root}/sys/fs/cgroup/memory"
    assert cgroup.version == 1
    assert cgroup.path == f"{base}/docker/abc"
    assert cgroup.ancestors == (f"{base}/docker/abc", f"{base}/docker", base)
    memory = read_container_memory(cgroup)
    assert (memory.limit, memory.usage, memory.working_set) == (GIB, 300 * MIB, 200 * MIB)


def test_v1_limit_on_an_ancestor_counts(tmp_path: Path) -> None:
    root = v1_docker(tmp_path, "/", v1_stat(MIB), limit=str(V1_NO_LIMIT_4K))
    Path(root, "sys/fs/cgroup/memory/docker/memory.limit_in_bytes").write_text(str(768 * MIB))

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    assert read_limit(cgroup) == 768 * MIB


@pytest.mark.parametrize("no_limit", [V1_NO_LIMIT_4K, V1_NO_LIMIT_64K])
def test_v1_largest_page_aligned_value_is_no_limit(tmp_path: Path, no_limit: int) -> None:
    assert no_limit >= NO_LIMIT_FLOOR
    root = v1_docker(tmp_path, "/docker/abc", v1_stat(MIB, no_limit), limit=f"{no_limit}\n")

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    assert read_limit(cgroup) is None
    assert read_container_memory(cgroup).limit is None


def test_v1_hierarchical_limit_smaller_than_the_local_one_wins(tmp_path: Path) -> None:
    # The limit is set above the container's cgroup, which its mount hides.
    stat = v1_stat(MIB, hierarchical_limit=512 * MIB)
    root = v1_docker(tmp_path, "/docker/abc", stat, limit=str(GIB))

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    assert read_limit(cgroup) == 512 * MIB
    assert read_container_memory(cgroup).limit == 512 * MIB


def test_hybrid_host_uses_v1_and_pressure_from_the_unified_hierarchy(tmp_path: Path) -> None:
    root = lay_out(
        tmp_path,
        "4:memory:/service/x\n1:cpu:/\n0::/service.slice\n",
        [
            mount("/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu"),
            mount("/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
            HYBRID_UNIFIED,
        ],
        {
            "sys/fs/cgroup/memory/service/x/memory.usage_in_bytes": str(10 * MIB),
            "sys/fs/cgroup/unified/cgroup.controllers": "",
            "sys/fs/cgroup/unified/service.slice/memory.pressure": PSI,
        },
    )

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    assert cgroup.version == 1
    assert cgroup.path == f"{root}/sys/fs/cgroup/memory/service/x"
    assert cgroup.pressure == f"{root}/sys/fs/cgroup/unified/service.slice/memory.pressure"
    memory = read_container_memory(cgroup)
    assert (memory.usage, memory.pressure_some, memory.pressure_full) == (10 * MIB, 1.5, 0.25)


def test_hybrid_host_takes_no_host_wide_pressure_for_a_container(tmp_path: Path) -> None:
    # As this machine: the v1 memory cgroup is a container's, the unified
    # path the root, whose memory.pressure is the whole host's
    files = {
        "sys/fs/cgroup/memory/service/x/memory.usage_in_bytes": str(10 * MIB),
        "sys/fs/cgroup/memory/memory.usage_in_bytes": str(90 * MIB),
        "sys/fs/cgroup/unified/cgroup.controllers": "",
        "sys/fs/cgroup/unified/memory.pressure": PSI,
    }
    mounts = [mount("/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"), HYBRID_UNIFIED]
    root = lay_out(tmp_path / "container", "4:memory:/service/x\n0::/\n", mounts, files)
    cgroup = find_memory_cgroup(root)
    assert cgroup is not None
    assert (cgroup.version, cgroup.pressure) == (1, None)
    # A process in the root memory cgroup too: the host's pressure is its own
    root = lay_out(tmp_path / "host", "4:memory:/\n0::/\n", mounts, files)
    cgroup = find_memory_cgroup(root)
    assert cgroup is not None
    assert cgroup.pressure == f"{root}/sys/fs/cgroup/unified/memory.pressure"


def test_combined_controllers_line_finds_memory(tmp_path: Path) -> None:
    root = lay_out(
        tmp_path,
        "3:cpu,memory:/x\n2:cpuacct:/\n",
        [
            mount("/", "/sys/fs/cgroup/cpuacct", "cgroup", "rw,cpuacct"),
            mount("/", "/sys/fs/cgroup/cpu,memory", "cgroup", "rw,cpu,memory"),
        ],
        {"sys/fs/cgroup/cpu,memory/x/memory.usage_in_bytes": "4096\n"},
    )

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    assert (cgroup.version, cgroup.path) == (1, f"{root}/sys/fs/cgroup/cpu,memory/x")
    assert read_usage(cgroup) == 4096


def test_mountinfo_octal_escapes_are_decoded(tmp_path: Path) -> None:
    root = lay_out(
        tmp_path,
        "4:memory:/x\n",
        [mount("/", "/cgroup\\040memory\\011v1", "cgroup", "rw,memory")],
        {"cgroup memory\tv1/x/memory.usage_in_bytes": "8192"},
    )

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    assert cgroup.path == f"{root}/cgroup memory\tv1/x"
    assert read_usage(cgroup) == 8192


def test_outside_the_mounted_directory_the_mount_point_is_used(tmp_path: Path) -> None:
    # The mount shows /docker/other; the process is in /docker/abc.
    root = lay_out(
        tmp_path,
        "4:memory:/docker/abc\n",
        [mount("/docker/other", "/sys/fs/cgroup/memory", "cgroup", "rw,memory")],
        {"sys/fs/cgroup/memory/memory.usage_in_bytes": "4096"},
    )

    cgroup = find_memory_cgroup(root)

    directory = f"{root}/sys/fs/cgroup/memory"
    assert cgroup == MemoryCgroup(1, directory, (directory,), None)


def test_path_outside_the_cgroup_namespace_falls_back_to_the_mount_point(tmp_path: Path) -> None:
    # The kernel shows a cgroup above the namespace's root with "..", which
    # joined to the mount point would name a directory outside it.
    root = lay_out(
        tmp_path,
        "0::/../sibling\n",
        [mount("/", "/sys/fs/cgroup/ns", "cgroup2")],
        {"sys/fs/cgroup/ns/memory.current": "4096", "sys/fs/cgroup/sibling/memory.current": "1"},
    )

    cgroup = find_memory_cgroup(root)

    directory = f"{root}/sys/fs/cgroup/ns"
    assert cgroup == MemoryCgroup(2, directory, (directory,), None)


def test_cgroup_directory_missing_falls_back_to_the_mount_point(tmp_path: Path) -> None:
    root = lay_out(
        tmp_path,
        "0::/gone\n",
        [mount("/", "/sys/fs/cgroup", "cgroup2")],
        {"sys/fs/cgroup/memory.current": "4096"},
    )

    cgroup = find_memory_cgroup(root)

    directory = f"{root}/sys/fs/cgroup"
    assert cgroup == MemoryCgroup(2, directory, (directory,), None)


# What cannot be read


def test_no_memory_controller_anywhere_is_none(tmp_path: Path) -> None:
    root = lay_out(
        tmp_path,
        "2:cpu:/\n1:name=systemd:/\n",
        [
            mount("/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu"),
            mount("/", "/sys/fs/cgroup/systemd", "cgroup", "rw,name=systemd"),
        ],
        {},
    )

    assert find_memory_cgroup(root) is None


def test_memory_line_without_its_mount_is_none(tmp_path: Path) -> None:
    root = lay_out(tmp_path, "4:memory:/x\n", [mount("/", "/proc", "proc", "rw")], {})

    assert find_memory_cgroup(root) is None


def test_missing_proc_files_are_none(tmp_path: Path) -> None:
    assert find_memory_cgroup(str(tmp_path)) is None
    root = v2_in_namespace(tmp_path)
    os.remove(f"{root}/proc/self/mountinfo")
    assert find_memory_cgroup(root) is None


def test_malformed_lines_are_skipped(tmp_path: Path) -> None:
    root = v2_in_namespace(tmp_path)
    Path(root, "proc/self/cgroup").write_text("garbage\nx:memory:/y\n4:memory:relative\n0::/\n")
    with open(f"{root}/proc/self/mountinfo", "a") as mountinfo:
        mountinfo.write("1 2 3 / /x rw - cgroup\n36 31 0:33 / /no-dash rw cgroup cgroup memory\n")

    cgroup = find_memory_cgroup(root)

    assert cgroup is not None
    assert (cgroup.version, cgroup.path) == (2, f"{root}/sys/fs/cgroup")


def test_garbled_numbers_make_only_their_figure_none(tmp_path: Path) -> None:
    root = v2_in_namespace(
        tmp_path,
        **{
            "memory.max": "lots\n",
            "memory.events": "oom_kill many\n",
            "memory.pressure": "some avg10=0.00 total=1500000\nfull avg10=0.00 total=x\n",
        },
    )
    cgroup = find_memory_cgroup(root)
    assert cgroup is not None

    memory = read_container_memory(cgroup)

    assert memory == ContainerMemory(
        limit=None,
        high=200 * MIB,
        usage=100 * MIB,
        working_set=70 * MIB,
        oom_kills=None,
        pressure_some=1.5,
        pressure_full=None,
    )
    Path(cgroup.path, "memory.current").write_text("-\n")
    Path(cgroup.path, "memory.stat").write_text("inactive_file\n")
    assert read_usage(cgroup) is None
    assert read_working_set(cgroup, 100) is None
    assert read_container_memory(cgroup).working_set is None


def test_files_gone_after_finding_make_every_figure_none(tmp_path: Path) -> None:
    cgroup = MemoryCgroup(2, str(tmp_path / "gone"), (str(tmp_path / "gone"),), None)

    assert read_container_memory(cgroup) == ContainerMemory(*[None] * 7)
    assert read_usage(cgroup) is None
    assert read_limit(cgroup) is None
    assert read_working_set(cgroup, 100) is None


def test_working_set_is_never_below_zero(tmp_path: Path) -> None:
    root = v2_in_namespace(tmp_path, **{"memory.stat": v2_stat(150 * MIB)})
    cgroup = find_memory_cgroup(root)
    assert cgroup is not None

    assert read_container_memory(cgroup).working_set == 0
    assert read_working_set(cgroup, 10 * MIB) == 0


# This machine, and how files are read


def test_this_machine_memory_cgroup_reads() -> None:
    cgroup = find_memory_cgroup()
    if cgroup is None:
        pytest.skip("no memory cgroup here (no /proc/self/cgroup, or no cgroup mount with memory)")
    with open("/proc/self/cgroup") as own:
        v1_memory = any("memory" in line.split(":")[1].split(",") for line in own if ":" in line)

    assert cgroup.version == (1 if v1_memory else 2)
    assert os.path.isdir(cgroup.path)
    assert cgroup.ancestors[0] == cgroup.path
    memory = read_container_memory(cgroup)
    if cgroup.version == 2 and not os.path.exists(f"{cgroup.path}/memory.current"):
        pytest.skip("this process is in the v2 root cgroup, which has no usage")
    assert isinstance(memory.usage, int) and memory.usage > 0
    assert memory.working_set is not None and 0 <= memory.working_set <= memory.usage
    assert memory.limit is None or memory.limit > 0


def test_every_read_goes_through_the_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hybrid_v1 = v1_docker(tmp_path / "v1", "/", v1_stat(MIB))
    v2 = v2_in_namespace(tmp_path / "v2")
    read: list[str] = []
    real = _core.read_small_file

    def recording(path: str, limit: int = 4096) -> bytes:
        read.append(os.fspath(path))
        return real(path, limit)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a descriptor opened from Python: {args}")

    monkeypatch.setattr(_core, "read_small_file", recording)
    with monkeypatch.context() as patched:
        for module, name in ((builtins, "open"), (io, "open"), (os, "open")):
            patched.setattr(module, name, refused)
        found = [find_memory_cgroup(root) for root in (hybrid_v1, v2)]
        figures = [read_container_memory(cgroup) for cgroup in found if cgroup is not None]
        limits = [read_limit(cgroup) for cgroup in found if cgroup is not None]

    assert [memory.usage for memory in figures] == [300 * MIB, 100 * MIB]
    assert limits == [GIB, 256 * MIB]
    names = {os.path.basename(path) for path in read}
    assert names >= {
        "cgroup",
        "mountinfo",
        "memory.usage_in_bytes",
        "memory.limit_in_bytes",
        "memory.oom_control",
        "memory.current",
        "memory.max",
        "memory.high",
        "memory.stat",
        "memory.events",
        "memory.pressure",
    }
