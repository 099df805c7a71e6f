"""`pdserve bench offline --context-growth 100,1000,4000 --max-batch 1,16`: how a decode step's
time grows with the context.

Per batch size B and context length C: B requests of C random prompt tokens each (seeded, no two
alike), all prefilled, then `--decode-steps` decode steps of all B together, timed with the
profile's timers (bench/offline/profile.py; the step without their own counting). Reported per
point: the median step, its decode attention, the rest (step - attention) and the bytes the
attention read. A step may grow with the context only by the attention's extra KV reads: the rest
should stay flat, and whatever of it grows is per-step work that grows with a request's length
(copying token lists, loops over all blocks), which the engine must not have.
"""

from __future__ import annotations

import os
import random
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from pdserve.bench.offline.engines import FLOAT32, EngineKind, Precision, build_llm, greedy_params
from pdserve.bench.offline.make_workloads import FIRST_ID, VOCAB
from pdserve.bench.offline.profile import StepRecord, instrumented
from pdserve.bench.offline.profile_report import step_seconds
from pdserve.bench.offline.workload import WorkloadRequest

SEED = 11
ATTENTION = "attention_decode"


@dataclass(frozen=True)
class GrowthPoint:
    context: int
    batch: int
    decode_steps: int  # steps of the whole batch timed
    step_ms: float  # medians over those steps
    attention_decode_ms: float
    rest_ms: float
    kv_read_mb: float  # what the decode attention read a step (K/V, its queries in and out)
    loadavg_1m_before: float


def prompts(context: int, batch: int) -> list[tuple[int, ...]]:
    rng = random.Random(SEED * 100_003 + context * 101 + batch)
    return [tuple(rng.randrange(FIRST_ID, VOCAB) for _ in range(context)) for _ in range(batch)]


def measure_point(
    model_dir: Path, context: int, batch: int, decode_steps: int, precision: Precision = FLOAT32
) -> GrowthPoint:
    workload = [WorkloadRequest(prompt, decode_steps + 1) for prompt in prompts(context, batch)]
    llm = build_llm(EngineKind.CONTINUOUS, model_dir, workload, batch, precision)
    warmup = WorkloadRequest(workload[0].prompt[:8], 4)
    llm.generate([list(warmup.prompt)], [greedy_params(warmup)])
    load = os.getloadavg()[0]
    with instrumented(llm) as timers:
        llm.generate([list(r.prompt) for r in workload], [greedy_params(r) for r in workload])
    steps = [s for s in timers.steps if not s.has_prefill and s.num_seqs == batch]
    assert steps, "no decode step ran the whole batch"
    step_ms = statistics.median(step_seconds(s) for s in steps) * 1e3
    attention_ms = _median_ms(steps, ATTENTION)
    return GrowthPoint(
        context=context,
        batch=batch,
        decode_steps=len(steps),
        step_ms=round(step_ms, 3),
        attention_decode_ms=round(attention_ms, 3),
        rest_ms=round(step_ms - attention_ms, 3),
        kv_read_mb=round(statistics.median(s.bytes.get(ATTENTION, 0) for s in steps) / 1e6, 2),
        loadavg_1m_before=round(load, 2),
    )


def _median_ms(steps: list[StepRecord], part: str) -> float:
    return statistics.median(s.seconds.get(part, 0.0) for s in steps) * 1e3


def report(points: list[GrowthPoint]) -> str:
    """One line a point, then per batch the rest's growth from the shortest context."""
    lines = []
    for point in points:
        lines.append(
            f"B={point.batch:<3} context {point.context:>5}: step {point.step_ms:7.2f} ms = "
            f"decode attention {point.attention_decode_ms:6.2f} ms ({point.kv_read_mb:.1f} MB of "
            f"KV) + rest {point.rest_ms:7.2f} ms  (median of {point.decode_steps} steps)"
        )
    for batch in dict.fromkeys(p.batch for p in points):
        row = [p for p in points if p.batch == batch]
        first, last = row[0], row[-1]
        lines.append(
            f"B={batch}: context {first.context} -> {last.context}: step "
            f"{last.step_ms / first.step_ms:.2f}x, rest {last.rest_ms / first.rest_ms:.2f}x"
        )
    return "\n".join(lines)


def as_record(point: GrowthPoint, precision: Precision) -> dict[str, object]:
    return {**asdict(point), "weights": precision.label}
