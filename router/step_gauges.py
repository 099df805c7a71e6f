"""What the router exports of each worker's measured steps, as its last Load report gives them
(costmodel/correction.py), kept current by the registry's polls and dropped with the worker:

- `pdserve_router_step_window{tier,worker,phase,quantity}`: the worker's recent steps of a phase,
  summed (quantity: steps, seconds, and the step shape's features). `pdserve autoscale` reads
  these to correct its own profile per tier, whatever profile the router holds, if any;
- `pdserve_router_step_correction{phase,tier,worker}`: with --profile, the factor by which
  adaptive placement scales that profile for the worker;
- `pdserve_router_worker_pending_prompt_tokens{tier,worker}`: its prompt tokens accepted and not
  yet computed (a prefill backlog `pdserve autoscale` sizes for, beside the arrivals)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from pdserve.core.serving.step_window_proto import step_windows_from_proto
from pdserve.costmodel.correction import StepPhase, StepWindow
from pdserve.costmodel.step_budget import StepCosts
from pdserve.router import metrics
from pdserve.v1 import common_pb2

# The quantities of a window, in the gauge's `quantity` label (planner/autoscale_metrics.py reads
# them back by these names).
WINDOW_QUANTITIES = (
    "steps",
    "seconds",
    "prefill_tokens",
    "prefill_pairs",
    "decode_seqs",
    "decode_context",
)


def window_quantities(window: StepWindow) -> dict[str, float]:
    work = window.work
    return {
        "steps": window.steps,
        "seconds": window.seconds,
        "prefill_tokens": work.prefill_tokens,
        "prefill_pairs": work.prefill_pairs,
        "decode_seqs": work.decode_seqs,
        "decode_context": work.decode_context,
    }


def export(
    costs: StepCosts | None, tier: str, worker: str, report: common_pb2.LoadResponse
) -> None:
    windows = step_windows_from_proto(report.step_windows)
    _export_windows(tier, worker, windows)
    metrics.PENDING_PROMPT_TOKENS.labels(tier, worker).set(report.num_pending_prompt_tokens)
    if costs is None:
        return
    corrected = costs.corrected(windows)
    for phase in StepPhase:
        factor = corrected.correction.factors.get(phase, 1.0)
        metrics.STEP_CORRECTION.labels(phase.value, tier, worker).set(factor)


def _export_windows(tier: str, worker: str, windows: Iterable[StepWindow]) -> None:
    reported = {window.phase: window for window in windows}
    for phase in StepPhase:
        window = reported.get(phase)
        if window is None:  # none of that phase in its window (any more)
            _forget_window(tier, worker, phase)
            continue
        for quantity, value in window_quantities(window).items():
            metrics.STEP_WINDOW.labels(tier, worker, phase.value, quantity).set(value)


def forget(tier: str, worker: str) -> None:
    with contextlib.suppress(KeyError):  # never polled
        metrics.PENDING_PROMPT_TOKENS.remove(tier, worker)
    for phase in StepPhase:
        _forget_window(tier, worker, phase)
        with contextlib.suppress(KeyError):  # never polled with --profile
            metrics.STEP_CORRECTION.remove(phase.value, tier, worker)


def _forget_window(tier: str, worker: str, phase: StepPhase) -> None:
    for quantity in WINDOW_QUANTITIES:
        with contextlib.suppress(KeyError):  # never reported
            metrics.STEP_WINDOW.remove(tier, worker, phase.value, quantity)
