"""Gauges of a worker's timed steps, by phase (names in docs/contract.md), read at scrape time from
its recent-step windows (costmodel/correction.py): the measured mean step, and with `--profile`
what the profile predicts for the same steps and the correction this worker applies to it."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from prometheus_client import Gauge

from pdserve.costmodel.correction import (
    StepPhase,
    StepRecorder,
    StepWindow,
    correction_from,
    predicted_seconds,
)
from pdserve.costmodel.profile import Profile
from pdserve.costmodel.step_budget import StepCosts


def register_step_gauges(tier: str, recorder: StepRecorder, costs: StepCosts | None) -> None:
    measured = Gauge(
        f"pdserve_{tier}_step_seconds",
        "Mean wall time of this worker's last steps of the phase (up to 32; 0: none yet)",
        ["phase"],
    )
    for phase in StepPhase:
        measured.labels(phase.value).set_function(_mean_of(recorder, phase, _seconds))
    if costs is None:
        return
    predicted = Gauge(
        f"pdserve_{tier}_step_predicted_seconds",
        "What --profile predicts, uncorrected, for the same steps (mean; 0: none yet)",
        ["phase"],
    )
    correction = Gauge(
        f"pdserve_{tier}_step_correction",
        "Measured / predicted time of the phase's steps: the factor this worker's step budget "
        "scales the profile by (1: too few steps yet)",
        ["phase"],
    )
    profile = costs.profile
    for phase in StepPhase:
        predicted.labels(phase.value).set_function(
            _mean_of(recorder, phase, partial(predicted_seconds, profile))
        )
        correction.labels(phase.value).set_function(_factor_of(recorder, phase, profile))


def _seconds(window: StepWindow) -> float:
    return window.seconds


def _mean_of(
    recorder: StepRecorder, phase: StepPhase, total: Callable[[StepWindow], float]
) -> Callable[[], float]:
    """Reads `total` of the phase's window per step (0 before its first step)."""

    def read() -> float:
        window = next((w for w in recorder.windows if w.phase is phase), None)
        return 0.0 if window is None else total(window) / window.steps

    return read


def _factor_of(recorder: StepRecorder, phase: StepPhase, profile: Profile) -> Callable[[], float]:
    def read() -> float:
        return correction_from(profile, recorder.windows).factors.get(phase, 1.0)

    return read
