"""Online correction of the cost model: what a worker's steps took against what the profile says
they should, by phase, so that a profile measured elsewhere (another host, another backend, a
busier machine) stops misleading placement and step budgets once the worker has run a few steps.

Each worker records the wall time of its recent steps and what they ran (`StepRecorder`: the last
WINDOW_STEPS steps of each phase, summed), and reports the sums with its Load. Whoever predicts that
worker's steps divides the measured time by its own prediction for the same work
(`correction_from`): the model is linear with a fixed cost per step, so the prediction for a sum
of steps is the prediction of the summed shape plus the fixed cost once per extra step. The ratio
scales that holder's predictions for the worker's next steps of the same phase
(`StepCosts.seconds`). The worker's own SLO step budget and the router's adaptive placement each
correct their own profile this way, so a worker and a router may hold different profiles.

Why a ratio per phase, not a refit of the five coefficients on the window: a serving window holds
steps of few shapes (the same batch of streams, step after step), too few to pin down five
coefficients; a ratio keeps the profile's shape dependence and fixes its scale, which is where a
profile from another host is wrong (Dynamo's SLA planner corrects its interpolated TTFT and ITL
the same way, by measured / predicted). Phases are corrected apart because their costs are
different parts of the model: a decode step is mostly the fixed cost and the weights' read, a
prefill step the per-token matmuls and attention pairs. Steps that swapped blocks are not
recorded: a swap is priced per block, apart from the step.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pdserve.costmodel.profile import Profile
from pdserve.costmodel.step_shape import StepShape

WINDOW_STEPS = 32  # steps of a phase the correction is measured over (the most recent)
MIN_STEPS = 4  # fewer measured steps of a phase leave its predictions uncorrected


class StepPhase(enum.Enum):
    """What a step ran, as far as its cost is concerned."""

    PREFILL = "prefill"  # prompt chunks only
    DECODE = "decode"  # one-token decodes only
    MIXED = "mixed"  # both

    @classmethod
    def of(cls, shape: StepShape) -> StepPhase | None:
        """None for a step that ran nothing."""
        prefill, decode = shape.prefill_tokens > 0, shape.decode_seqs > 0
        if prefill and decode:
            return cls.MIXED
        if prefill:
            return cls.PREFILL
        return cls.DECODE if decode else None


@dataclass(frozen=True)
class StepWindow:
    """A worker's recent steps of one phase: how many, what they ran in all, how long in all."""

    phase: StepPhase
    steps: int
    work: StepShape  # their shapes, summed
    seconds: float  # their measured wall time, summed


class StepRecorder:
    """The last `window_steps` steps of each phase. The engine thread records; any thread reads
    `windows` (a tuple replaced whole after each step, never changed in place)."""

    def __init__(self, window_steps: int = WINDOW_STEPS) -> None:
        self._steps: dict[StepPhase, deque[tuple[StepShape, float]]] = {
            phase: deque(maxlen=window_steps) for phase in StepPhase
        }
        self.windows: tuple[StepWindow, ...] = ()

    def record(self, shape: StepShape, seconds: float) -> None:
        phase = StepPhase.of(shape)
        if phase is None:
            return
        self._steps[phase].append((shape, seconds))
        self.windows = tuple(_window(phase, steps) for phase, steps in self._steps.items() if steps)


def _window(phase: StepPhase, steps: Iterable[tuple[StepShape, float]]) -> StepWindow:
    work, seconds, count = StepShape(), 0.0, 0
    for shape, took in steps:
        work, seconds, count = work + shape, seconds + took, count + 1
    return StepWindow(phase, count, work, seconds)


@dataclass(frozen=True)
class Correction:
    """Measured / predicted step time per phase (a phase not in `factors` is not corrected)."""

    factors: Mapping[StepPhase, float] = field(default_factory=dict)

    def factor(self, shape: StepShape) -> float:
        phase = StepPhase.of(shape)
        return 1.0 if phase is None else self.factors.get(phase, 1.0)


def predicted_seconds(profile: Profile, window: StepWindow) -> float:
    """What `profile` predicts for the window's steps, summed (exact for the linear model: the
    summed shape's prediction carries the fixed cost once, the other steps add theirs)."""
    fixed_per_step = profile.step_seconds(StepShape())
    return profile.step_seconds(window.work) + (window.steps - 1) * fixed_per_step


def correction_from(
    profile: Profile, windows: Iterable[StepWindow], min_steps: int = MIN_STEPS
) -> Correction:
    """The factors that turn `profile`'s predictions into what the windows measured."""
    factors = {}
    for window in windows:
        predicted = predicted_seconds(profile, window)
        if window.steps >= min_steps and predicted > 0 and window.seconds > 0:
            factors[window.phase] = window.seconds / predicted
    return Correction(factors)
