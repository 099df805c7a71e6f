"""Which host a profile was measured on, and a loud warning when it is read on another.

A profile's coefficients are this engine's step times on one host: another CPU model, other
vector instructions (AVX-512 or AMX against AVX2 decide which matmul kernels run) or another core
count give other times, by 2x and more between the host classes this project runs on. Nothing in
a profile's numbers shows that, so the profile carries the host's fingerprint and whoever loads
it compares it with the host it runs on.

Torch-free and cheap (one read of /proc/cpuinfo), so the router checks as readily as a worker.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CPUINFO = Path("/proc/cpuinfo")
# The ISA extensions that decide which matmul and attention kernels a CPU backend runs.
KERNEL_ISA_FLAGS = frozenset(
    {
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx_vnni",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
        "asimd",
        "sve",
    }
)
REPROFILE_HINT = "re-profile this host: pdserve profile --out FILE (then pass --profile FILE)"


@dataclass(frozen=True)
class HostFingerprint:
    cpu_model: str
    isa_flags: tuple[str, ...]  # the KERNEL_ISA_FLAGS the CPU has, sorted
    logical_cpus: int

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "isa_flags": list(self.isa_flags)}

    @classmethod
    def from_json(cls, document: Mapping[str, object]) -> HostFingerprint:
        flags = document["isa_flags"]
        cpus = document["logical_cpus"]
        if not isinstance(flags, list) or not isinstance(cpus, int):
            raise TypeError("host: isa_flags must be a list and logical_cpus an integer")
        return cls(str(document["cpu_model"]), tuple(str(f) for f in flags), cpus)

    def differences(self, other: HostFingerprint) -> list[str]:
        """What differs from `other`, one phrase per field (empty when nothing does)."""
        mine, theirs = self.to_json(), other.to_json()
        return [
            f"{name} {mine[name]!r} here, {theirs[name]!r} there"
            for name in mine
            if mine[name] != theirs[name]
        ]


def this_host(cpuinfo: Path = CPUINFO) -> HostFingerprint:
    model, flags = _cpu_model_and_flags(cpuinfo)
    return HostFingerprint(model, tuple(sorted(flags & KERNEL_ISA_FLAGS)), os.cpu_count() or 1)


def _cpu_model_and_flags(cpuinfo: Path) -> tuple[str, frozenset[str]]:
    """The first processor's model name and flags (Linux); the platform's name elsewhere."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return platform.processor() or platform.machine(), frozenset()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name") or fields.get("Model") or platform.machine()
    flags = fields.get("flags") or fields.get("Features") or ""
    return model, frozenset(flags.split())


_warned: set[str] = set()


def warn_if_foreign(measured_on: HostFingerprint | None, source: str) -> bool:
    """Warns (once per `source` in this process) when the profile at `source` was measured on
    another host, or says nothing of its host; whether it did."""
    if measured_on is None:
        problem = "says nothing of the host it was measured on (made before fingerprints)"
    else:
        differences = this_host().differences(measured_on)
        if not differences:
            return False
        problem = "was measured on another host: " + "; ".join(differences)
    if source not in _warned:
        _warned.add(source)
        log.warning(
            "PROFILE MISMATCH: %s %s; its step times may be off by 2x or more, and so are the "
            "placement, step budget and plans made from them; %s",
            source,
            problem,
            REPROFILE_HINT,
        )
    return True
