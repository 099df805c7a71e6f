"""Turns the step timers of a profiled run into exclusive parts that add up to the step time."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.offline.engines import EngineKind, build_llm, greedy_params
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
    """Each part's own seconds: the `*_other` parts are what the named parts leave over."""
    s = record.seconds
    parts = {name: s[name] for name in ("schedule", "build_batch", *FORWARD_PARTS, "sample")}
    parts["forward_other"] = s["forward"] - sum(s[name] for name in FORWARD_PARTS)
    parts["runner_other"] = s["execute"] - s["build_batch"] - s["forward"] - s["sample"]
    parts["engine_other"] = s["step"] - s["schedule"] - s["execute"]
    return parts


@dataclass(frozen=True)
class StepGroup:
    label: str
    steps: tuple[StepRecord, ...]

    @property
    def total(self) -> float:
        return float(sum(step.seconds["step"] for step in self.steps))

    def part_total(self, part: str) -> float:
        return sum(exclusive_parts(step)[part] for step in self.steps)


def profile_workload(
    model_dir: Path, workload: list[WorkloadRequest], max_batch: int
) -> list[StepGroup]:
    """Runs the continuous engine over the workload with timers; steps grouped by kind."""
    llm = build_llm(EngineKind.CONTINUOUS, model_dir, workload, max_batch)
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


def group_report(group: StepGroup) -> str:
    if not group.steps:
        return f"{group.label}: none"
    count = len(group.steps)
    seqs = statistics.fmean(step.num_seqs for step in group.steps)
    tokens = sum(step.num_sampled for step in group.steps)
    lines = [
        f"{group.label}: {count} steps, {seqs:.1f} sequences/step on average, "
        f"{group.total:.2f} s, {1e3 * group.total / count:.2f} ms/step, "
        f"{tokens / group.total:.1f} sampled tokens/s",
        f"  {'part':<18} {'ms/step':>9} {'share':>7}",
    ]
    for part in PARTS:
        seconds = group.part_total(part)
        lines.append(
            f"  {part:<18} {1e3 * seconds / count:>9.2f} {100 * seconds / group.total:>6.1f}%"
        )
    return "\n".join(lines)


def profile_report(groups: list[StepGroup]) -> str:
    return "\n\n".join(group_report(group) for group in groups)
