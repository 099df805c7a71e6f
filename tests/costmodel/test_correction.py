"""Online correction of the cost model (costmodel/correction.py): a worker's recorded steps turn a
deliberately wrong profile's predictions into what the steps take, phase by phase."""

from __future__ import annotations

import random

import pytest

from pdserve.core.serving.step_window_proto import (
    step_windows_from_proto,
    step_windows_to_proto,
)
from pdserve.costmodel.correction import (
    MIN_STEPS,
    WINDOW_STEPS,
    Correction,
    StepPhase,
    StepRecorder,
    StepWindow,
    correction_from,
    predicted_seconds,
)
from pdserve.costmodel.profile import BlockCosts, CostModel, Profile, ServingCosts
from pdserve.costmodel.step_budget import StepCosts, WorkerStepBudget
from pdserve.costmodel.step_shape import StepShape

BLOCKS = BlockCosts(1, 0.0, 0.0, 0.0, 1e30)
# What the steps really take here: 40 ms a step, 0.5 ms a prompt token, 3 ms a decoding stream,
# 10 us a token of context, and what serving adds.
TRUE = Profile(
    CostModel((0.04, 0.0005, 1e-7, 0.003, 1e-5)),
    BLOCKS,
    block_size=16,
    contention=1.2,
    serving=ServingCosts(per_step_s=0.01, per_token_s=0.001),
)


def scaled(profile: Profile, factor: float) -> Profile:
    """`profile` with every cost `factor` times what it is."""
    model = CostModel(tuple(c * factor for c in profile.model.coefficients))
    serving = ServingCosts(
        profile.serving.per_step_s * factor, profile.serving.per_token_s * factor
    )
    return Profile(model, BLOCKS, 16, contention=profile.contention, serving=serving)


def decode_step(rng: random.Random) -> StepShape:
    streams = rng.randint(1, 16)
    return StepShape.decodes(streams, streams * rng.randint(50, 2000))


def prefill_step(rng: random.Random) -> StepShape:
    return StepShape.prompt_chunk(rng.randint(0, 1000), rng.randint(2, 512))


def mixed_step(rng: random.Random) -> StepShape:
    return decode_step(rng) + prefill_step(rng)


STEPS = {
    StepPhase.DECODE: decode_step,
    StepPhase.PREFILL: prefill_step,
    StepPhase.MIXED: mixed_step,
}


def measured(shape: StepShape, rng: random.Random, noise: float = 0.05) -> float:
    """What a step of `shape` takes under TRUE, give or take `noise`."""
    return TRUE.step_seconds(shape) * rng.uniform(1 - noise, 1 + noise)


def test_a_step_phase_is_what_it_ran() -> None:
    assert StepPhase.of(StepShape.decodes(3, 300)) is StepPhase.DECODE
    assert StepPhase.of(StepShape.prompt_chunk(0, 40)) is StepPhase.PREFILL
    assert StepPhase.of(StepShape.decodes(1, 9) + StepShape.prompt_chunk(0, 8)) is StepPhase.MIXED
    assert StepPhase.of(StepShape()) is None


def test_a_window_sums_the_last_steps_of_its_phase() -> None:
    recorder = StepRecorder(window_steps=3)
    for seqs in (1, 2, 3, 4):
        recorder.record(StepShape.decodes(seqs, 10 * seqs), 0.1 * seqs)
    recorder.record(StepShape.prompt_chunk(0, 5), 0.5)
    recorder.record(StepShape(), 9.0)  # ran nothing: not a step of any phase
    windows = {window.phase: window for window in recorder.windows}
    assert set(windows) == {StepPhase.DECODE, StepPhase.PREFILL}
    decode = windows[StepPhase.DECODE]
    assert (decode.steps, decode.work, decode.seconds) == (
        3,
        StepShape.decodes(9, 90),
        pytest.approx(0.9),
    )
    assert windows[StepPhase.PREFILL].steps == 1


@pytest.mark.parametrize("phase", list(StepPhase))
def test_a_window_is_predicted_as_the_sum_of_its_steps(phase: StepPhase) -> None:
    rng = random.Random(phase.value)
    recorder = StepRecorder()
    shapes = [STEPS[phase](rng) for _ in range(10)]
    for shape in shapes:
        recorder.record(shape, 1.0)
    (window,) = recorder.windows
    expected = sum(TRUE.step_seconds(shape) for shape in shapes)
    assert predicted_seconds(TRUE, window) == pytest.approx(expected)


@pytest.mark.parametrize("wrong_by", [0.25, 0.5, 2.0, 4.0])
def test_a_wrong_profile_predicts_within_15_percent_after_a_window_of_steps(
    wrong_by: float,
) -> None:
    """Corrected on the steps seen so far, each new step is predicted before it runs; from the
    MIN_STEPS-th step of its phase on, every prediction is within 15 % of what it took."""
    rng = random.Random(int(wrong_by * 100))
    costs = StepCosts(scaled(TRUE, wrong_by), 2048)
    recorder = StepRecorder()
    seen = dict.fromkeys(StepPhase, 0)
    for _ in range(300):
        phase = rng.choice(list(StepPhase))
        shape = STEPS[phase](rng)
        took = measured(shape, rng)
        predicted = costs.corrected(recorder.windows).seconds(shape)
        if seen[phase] >= MIN_STEPS:
            assert predicted == pytest.approx(took, rel=0.15), (phase, seen[phase])
        else:  # uncorrected until then
            assert predicted == pytest.approx(costs.seconds(shape))
        recorder.record(shape, took)
        seen[phase] += 1
    assert min(seen.values()) > WINDOW_STEPS  # every window turned over


def test_each_phase_is_corrected_by_its_own_steps() -> None:
    """A host where decodes run at the profile's speed and prompts at a third of it."""
    rng = random.Random(7)
    recorder = StepRecorder()
    for _ in range(WINDOW_STEPS):
        decode, prefill = decode_step(rng), prefill_step(rng)
        recorder.record(decode, TRUE.step_seconds(decode))
        recorder.record(prefill, 3 * TRUE.step_seconds(prefill))
    factors = correction_from(TRUE, recorder.windows).factors
    assert factors[StepPhase.DECODE] == pytest.approx(1.0)
    assert factors[StepPhase.PREFILL] == pytest.approx(3.0)
    assert StepPhase.MIXED not in factors  # no mixed step yet: uncorrected


def test_too_few_steps_leave_the_profile_as_it_is() -> None:
    shape = StepShape.decodes(2, 100)
    window = StepWindow(StepPhase.DECODE, MIN_STEPS - 1, shape, 100.0)
    assert correction_from(TRUE, [window]) == Correction()
    assert StepCosts(TRUE, 2048).corrected([window]).seconds(shape) == TRUE.step_seconds(shape)


def test_a_budget_with_a_recorder_grants_what_the_measured_steps_leave() -> None:
    """A profile 4x too slow sees no room for prompt tokens beside 8 streams under a 0.2 s SLO;
    once the worker's own steps show it 4x faster, the step takes what the true costs allow."""
    slo, decodes = 0.2, StepShape.decodes(8, 800)
    recorder = StepRecorder()
    budget = WorkerStepBudget(StepCosts(scaled(TRUE, 4.0), 2048, slo), recorder=recorder)
    truth = StepCosts(TRUE, 2048, slo)
    assert budget.current_costs().seconds(decodes) > slo
    for _ in range(MIN_STEPS):
        recorder.record(decodes, TRUE.step_seconds(decodes))
        recorder.record(decodes + StepShape.prompt_chunk(0, 64), TRUE.step_seconds(decodes) + 0.04)
    granted = budget.current_costs().for_step(decodes).grant(0, 2048)
    expected = truth.for_step(decodes).grant(0, 2048)
    assert granted == pytest.approx(expected, rel=0.15) and granted > 16


def test_windows_cross_the_wire_unchanged() -> None:
    rng = random.Random(3)
    recorder = StepRecorder()
    for phase in StepPhase:
        for _ in range(5):
            shape = STEPS[phase](rng)
            recorder.record(shape, measured(shape, rng))
    assert step_windows_from_proto(step_windows_to_proto(recorder.windows)) == list(
        recorder.windows
    )
