"""pdserve/local/cpu_limit.py: which cgroup interface a host gets, the quota each pod's group is
given, cleanup; and, where this host has a CPU controller (as root), that a process in a group
really gets no more than its quota."""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdserve.local.cpu_limit import (
    CgroupVersion,
    CpuGroups,
    CpuLimitError,
    find_controller,
    pod_cpus,
)


def _v1(root: Path) -> Path:
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    return root


def _v2(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids")
    return root


def test_v1_is_taken_where_the_cpu_controller_is_mounted_and_v2_otherwise(tmp_path: Path) -> None:
    assert find_controller(_v1(tmp_path / "v1")) == (tmp_path / "v1" / "cpu", CgroupVersion.V1)
    assert find_controller(_v2(tmp_path / "v2")) == (tmp_path / "v2", CgroupVersion.V2)
    hybrid = _v2(_v1(tmp_path / "hybrid"))  # v1 holds the cpu controller: v2 cannot use it
    assert find_controller(hybrid)[1] is CgroupVersion.V1


def test_no_cpu_controller_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("memory pids")  # v2 without cpu
    with pytest.raises(CpuLimitError, match="--pod-cpus: no CPU cgroup controller"):
        find_controller(tmp_path)


def test_a_v1_group_gets_its_quota_per_100_ms_period(tmp_path: Path) -> None:
    groups = CpuGroups(_v1(tmp_path))
    group = groups.create("pds50051-decode-0", 0.5)
    assert group.path == tmp_path / "cpu" / "pdserve" / "pds50051-decode-0"
    assert (group.path / "cpu.cfs_period_us").read_text() == "100000"
    assert (group.path / "cpu.cfs_quota_us").read_text() == "50000"
    assert [group.torch_threads, groups.create("x-1", 1.5).torch_threads] == [1, 2]


def test_a_v2_group_gets_cpu_max_and_the_parent_hands_down_the_controller(tmp_path: Path) -> None:
    groups = CpuGroups(_v2(tmp_path))
    assert (tmp_path / "pdserve" / "cgroup.subtree_control").read_text() == "+cpu"
    group = groups.create("pds50051-prefill-0", 0.25)
    assert (group.path / "cpu.max").read_text() == "25000 100000"


def test_groups_go_with_their_pods_and_a_killed_runs_are_cleared(tmp_path: Path) -> None:
    groups = CpuGroups(_v1(tmp_path))
    gone = groups.create("pds50051-decode-0", 1.0)
    for name in ("pds50051-decode-1", "pds50051-prefill-0", "pds60000-decode-0"):
        groups.create(name, 1.0)
    for group_dir in groups.parent.iterdir():  # a real cgroup's files vanish with it
        for file in group_dir.iterdir():
            file.unlink()
    groups.remove(gone)
    assert not gone.path.exists()
    assert groups.remove_stale("pds50051") == ["pds50051-decode-1", "pds50051-prefill-0"]
    assert [p.name for p in groups.parent.iterdir()] == ["pds60000-decode-0"]


@pytest.mark.parametrize("text", ["0", "-1", "half", "nan"])
def test_pod_cpus_must_be_a_positive_number(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        pod_cpus(text)
    assert pod_cpus("0.5") == 0.5


def _host_groups() -> CpuGroups:
    try:
        return CpuGroups()
    except CpuLimitError as error:
        pytest.skip(str(error))


def test_a_busy_process_in_a_quarter_core_group_gets_a_quarter_core(tmp_path: Path) -> None:
    groups = _host_groups()
    group = groups.create(f"pdstest{tmp_path.name[-12:]}-busy-0", 0.25)
    spin = "import time\nend = time.monotonic() + 2\nwhile time.monotonic() < end: pass"
    start, before = time.monotonic(), _children_cpu_seconds()
    busy = subprocess.Popen([sys.executable, "-c", spin], preexec_fn=group.join)
    try:
        assert busy.wait(timeout=30) == 0
        cpu_seconds = _children_cpu_seconds() - before
        wall = time.monotonic() - start
        assert cpu_seconds < 0.25 * wall + 0.15, (cpu_seconds, wall)  # a period's slack
        assert group.throttled_seconds() > 0.5
    finally:
        busy.kill()
        busy.wait()
        groups.remove(group)
    assert not group.path.exists()


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
