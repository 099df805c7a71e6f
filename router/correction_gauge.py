"""`pdserve_router_step_correction{phase,tier,worker}`: the factor by which adaptive placement
scales the profile for each worker, as the worker's last Load report gives it
(costmodel/correction.py). Kept current by the registry's polls, dropped with the worker."""

from __future__ import annotations

import contextlib

from pdserve.core.serving.step_window_proto import step_windows_from_proto
from pdserve.costmodel.correction import StepPhase
from pdserve.costmodel.step_budget import StepCosts
from pdserve.router import metrics
from pdserve.v1 import common_pb2


def export(costs: StepCosts, tier: str, worker: str, report: common_pb2.LoadResponse) -> None:
    corrected = costs.corrected(step_windows_from_proto(report.step_windows))
    for phase in StepPhase:
        factor = corrected.correction.factors.get(phase, 1.0)
        metrics.STEP_CORRECTION.labels(phase.value, tier, worker).set(factor)


def forget(tier: str, worker: str) -> None:
    for phase in StepPhase:
        with contextlib.suppress(KeyError):  # never polled successfully
            metrics.STEP_CORRECTION.remove(phase.value, tier, worker)
