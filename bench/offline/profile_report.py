"""Turns the step timers of a profiled run into exclusive parts that add up to the step time, each
beside the floor of what it must move and compute on this host (bench/offline/bounds.py)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.offline.bounds import HostBounds
from pdserve.bench.offline.engines import (
    FLOAT32,
    EngineKind,
    Precision,
    build_llm,
    greedy_params,
)
from pdserve.bench.offline.profile import FORWARD_PARTS, StepRecord, instrumented
from pdserve.bench.offline.workload import WorkloadRequest

# Exclusive parts, in the order a step runs them.
PARTS = (
    "schedule",
    "build_batch",
    *FORWARD_PARTS,
    "forward_other",
    "sample",
    "runner_other",
    "engine_other",
)


def exclusive_parts(record: StepRecord) -> dict[str, float]:
    """Each part's own seconds: the `*_other` parts are what the named parts leave over (the
    profile's own counting left out)."""
    s = record.seconds
    parts = {name: s[name] for name in ("schedule", "build_batch", *FORWARD_PARTS, "sample")}
    forward = s["forward"] - s["accounting"]
    parts["forward_other"] = forward - sum(s[name] for name in FORWARD_PARTS)
    parts["runner_other"] = s["execute"] - s["build_batch"] - s["forward"] - s["sample"]
    parts["engine_other"] = s["step"] - s["schedule"] - s["execute"]
    return parts


def step_seconds(record: StepRecord) -> float:
    """The step's time without the profile's own counting."""
    return record.seconds["step"] - record.seconds["accounting"]


@dataclass(frozen=True)
class StepGroup:
    label: str
    steps: tuple[StepRecord, ...]

    @property
    def total(self) -> float:
        return float(sum(step_seconds(step) for step in self.steps))

    def part_total(self, part: str) -> float:
        return sum(exclusive_parts(step)[part] for step in self.steps)

    def part_bytes(self, part: str) -> int:
        return sum(step.bytes.get(part, 0) for step in self.steps)

    def part_flops(self, part: str) -> int:
        return sum(step.flops.get(part, 0) for step in self.steps)


def profile_workload(
    model_dir: Path,
    workload: list[WorkloadRequest],
    max_batch: int,
    precision: Precision = FLOAT32,
) -> list[StepGroup]:
    """Runs the continuous engine over the workload with timers; steps grouped by kind."""
    llm = build_llm(EngineKind.CONTINUOUS, model_dir, workload, max_batch, precision)
    warmup = [list(workload[0].prompt[:8])]
    llm.generate(warmup, [greedy_params(WorkloadRequest(workload[0].prompt[:8], 4))])
    with instrumented(llm) as timers:
        llm.generate([list(r.prompt) for r in workload], [greedy_params(r) for r in workload])
    steps = tuple(timers.steps)
    return [
        StepGroup("all steps", steps),
        StepGroup("decode-only steps", tuple(s for s in steps if not s.has_prefill)),
        StepGroup("steps with a prefill", tuple(s for s in steps if s.has_prefill)),
    ]


def group_report(group: StepGroup, bounds: HostBounds) -> str:
    if not group.steps:
        return f"{group.label}: none"
    count = len(group.steps)
    seqs = statistics.fmean(step.num_seqs for step in group.steps)
    tokens = sum(step.num_sampled for step in group.steps)
    lines = [
        f"{group.label}: {count} steps, {seqs:.1f} sequences/step on average, "
        f"{group.total:.2f} s, {1e3 * group.total / count:.2f} ms/step, "
        f"{tokens / group.total:.1f} sampled tokens/s",
        f"  {'part':<18} {'ms/step':>9} {'share':>7} {'MB/step':>9} {'MFLOP/step':>11}"
        f" {'floor ms':>9} {'x floor':>8}",
    ]
    floors = 0.0
    for part in PARTS:
        seconds = group.part_total(part)
        line = f"  {part:<18} {1e3 * seconds / count:>9.2f} {100 * seconds / group.total:>6.1f}%"
        nbytes, flops = group.part_bytes(part), group.part_flops(part)
        if nbytes or flops:
            floor = bounds.floor_seconds(nbytes, flops)
            floors += floor
            line += (
                f" {nbytes / count / 1e6:>9.2f} {flops / count / 1e6:>11.1f}"
                f" {1e3 * floor / count:>9.3f} {seconds / floor:>8.1f}"
            )
        lines.append(line)
    lines.append(
        f"  {'step':<18} {1e3 * group.total / count:>9.2f} {'':>7} {'':>9} {'':>11}"
        f" {1e3 * floors / count:>9.3f} {group.total / floors:>8.1f}"
    )
    return "\n".join(lines)


def bounds_report(bounds: HostBounds) -> str:
    return (
        f"host bounds: copy bandwidth {bounds.copy_bandwidth / 1e9:.1f} GB/s (read + written), "
        f"matmul peak {bounds.peak_flops / 1e9:.1f} GFLOP/s; a part's floor is the larger of "
        "its bytes / bandwidth and its flops / peak (parts without a count have none)"
    )


def profile_report(groups: list[StepGroup], bounds: HostBounds) -> str:
    return "\n\n".join(group_report(group, bounds) for group in groups)
