"""`pdserve up --netns --pod-cpus C`: each worker pod in a CPU cgroup of its own with a quota of C
cores, as a Kubernetes `resources.limits.cpu` puts each container under CFS bandwidth control.

The quota is CFS bandwidth: C x 100 ms of CPU time in every 100 ms period, spread over any of the
host's cores (not a cpuset: a pod limited to 0.5 may run on both cores, half the time in all).
Two interfaces exist on machines of this kind, and the first found is used:

- cgroup v1, the `cpu` controller's hierarchy (`/sys/fs/cgroup/cpu`): `cpu.cfs_period_us` and
  `cpu.cfs_quota_us`;
- cgroup v2, the unified hierarchy with the `cpu` controller available (`/sys/fs/cgroup`):
  `cpu.max` ("QUOTA PERIOD"), the controller enabled for the children of the group made here.

A hybrid host (v1 controllers, an empty v2 tree beside them) takes v1: there the `cpu` controller
is bound to v1 and v2 cannot use it. Neither: `CpuLimitError`, which says so.

A worker joins its group in the child before exec (`join`), so every thread and process it ever
starts is under the quota; torch gets ceil(C) intra-op threads (`torch_threads`), as a pod's
runtime sees its limit. Groups are named after the pod (`pds<port>-decode-0`) under one
`pdserve` group, removed when the pod is, and `remove_stale` clears what a killed `pdserve up` on
the same port left.
"""

from __future__ import annotations

import argparse
import enum
import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000  # the kernel's and Kubernetes' default CFS period
GROUP = "pdserve"  # every pod's group sits under this one


class CpuLimitError(RuntimeError):
    """No CPU cgroup controller can limit a pod here (not root, or no cpu controller)."""


class CgroupVersion(enum.Enum):
    V1 = "cgroup v1 (cpu.cfs_quota_us)"
    V2 = "cgroup v2 (cpu.max)"


@dataclass(frozen=True)
class CpuGroup:
    """One pod's cgroup: where it is, which interface, and its quota in cores."""

    path: Path
    version: CgroupVersion
    cores: float

    def join(self) -> None:
        """Moves the calling process into the group (run in the child, before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    @property
    def torch_threads(self) -> int:
        return max(1, math.ceil(self.cores))

    def throttled_seconds(self) -> float:
        """How long the quota has held the group's processes back, in all (`cpu.stat`: v1's
        throttled_time in ns, v2's throttled_usec)."""
        key, scale = (
            ("throttled_time", 1e9)
            if self.version is CgroupVersion.V1
            else (
                "throttled_usec",
                1e6,
            )
        )
        for line in (self.path / "cpu.stat").read_text().splitlines():
            name, value = line.split()
            if name == key:
                return int(value) / scale
        raise CpuLimitError(f"{self.path}/cpu.stat has no {key}")


def find_controller(root: Path = CGROUP_ROOT) -> tuple[Path, CgroupVersion]:
    """The hierarchy that can limit CPU here, and its interface."""
    v1 = root / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        return v1, CgroupVersion.V1
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return root, CgroupVersion.V2
    raise CpuLimitError(
        f"--pod-cpus: no CPU cgroup controller under {root} (neither v1 cpu/cpu.cfs_quota_us nor "
        "v2 cgroup.controllers with cpu); run without --pod-cpus, or on a host with either"
    )


class CpuGroups:
    """Makes and removes the pods' groups under one controller (`find_controller`)."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        hierarchy, self.version = find_controller(root)
        self.parent = hierarchy / GROUP
        try:
            self.parent.mkdir(exist_ok=True)
            if self.version is CgroupVersion.V2:  # the children may use the cpu controller
                (self.parent / "cgroup.subtree_control").write_text("+cpu")
        except OSError as error:
            raise CpuLimitError(f"--pod-cpus: cannot make {self.parent}: {error}") from error

    def create(self, name: str, cores: float) -> CpuGroup:
        if cores <= 0:
            raise ValueError(f"--pod-cpus: must be > 0, got {cores}")
        path = self.parent / name
        path.mkdir(exist_ok=True)
        quota = max(1_000, round(cores * PERIOD_US))  # the kernel's smallest quota is 1 ms
        if self.version is CgroupVersion.V1:
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        return CpuGroup(path, self.version, cores)

    def remove(self, group: CpuGroup) -> None:
        """Removes an empty group (its processes have exited); a busy one stays for
        `remove_stale`."""
        try:
            group.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:  # still has a process in it
            return

    def remove_stale(self, prefix: str) -> list[str]:
        """Removes the empty groups whose names start with `prefix` (a killed run's)."""
        removed = []
        for path in sorted(self.parent.glob(f"{prefix}-*")):
            try:
                path.rmdir()
            except OSError:
                continue
            removed.append(path.name)
        return removed


def pod_cpus(text: str) -> float:
    """argparse type of --pod-cpus: cores, > 0 (0.5 = half a core; above the host's count the
    quota never binds)."""
    try:
        cores = float(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of cores") from error
    if not cores > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return cores
