"""planner/autoscale.py: the load it sizes for, the fewest pods the simulator says meet the SLOs,
and when it acts (up at once, down after a run of quieter intervals, never below the streams);
the workers' measured steps correct the profile per tier."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
from typing import Any

import pytest

from pdserve.core.config import EngineConfig
from pdserve.costmodel.correction import StepPhase, StepWindow, predicted_seconds
from pdserve.costmodel.profile import CostModel, load_profile
from pdserve.costmodel.step_shape import StepShape
from pdserve.planner import autoscale
from pdserve.planner.autoscale import Action, Autoscaler, Policy, Shape, trace
from pdserve.planner.autoscale_cli import seen_record
from pdserve.planner.autoscale_observation import (
    LengthHistogram,
    Observation,
    poisson_lower,
    poisson_upper,
)
from pdserve.planner.plan import Candidate, PerRequestSlo, Slo, evaluate
from pdserve.planner.sim_cluster import Deployment
from pdserve.planner.workload import TraceRequest
from pdserve.router.placement.prefill_place import PlacementConfig
from tests.fakes import PROFILE_OTHER_HOST
from tests.planner.helpers import fixed_step_profile

POWERS = tuple(float(2**i) for i in range(13))
SLO = Slo(ttft_p90_s=2.0, itl_p99_s=0.5)


def _histogram(**counts: float) -> LengthHistogram:
    """Counts by bucket bound, e.g. _histogram(b64=10) for 10 lengths in (32, 64]."""
    by_bound = {float(name.removeprefix("b")): count for name, count in counts.items()}
    return LengthHistogram(POWERS, tuple(by_bound.get(bound, 0.0) for bound in POWERS))


def _chat(rate: float, in_flight: int = 0, seconds: float = 30.0) -> Observation:
    return Observation(
        seconds, rate * seconds, _histogram(b64=3, b128=1), _histogram(b64=1), in_flight
    )


def test_lengths_are_drawn_inside_their_buckets() -> None:
    histogram = _histogram(b64=1, b1024=1)
    rng = random.Random(0)
    lengths = [histogram.draw(rng) for _ in range(400)]
    assert all(33 <= n <= 64 or 513 <= n <= 1024 for n in lengths)
    assert 150 < sum(n <= 64 for n in lengths) < 250  # the two buckets weigh the same


def test_draws_keep_the_observed_mean_where_the_sum_is_known() -> None:
    """Outputs of 130-160 tokens fall low in their (128, 256] bucket: uniform within it they
    would be drawn 192 long on average; with the histogram's sum, 145."""
    low_in_bucket = _histogram(b256=100)
    rng = random.Random(0)
    uniform = [low_in_bucket.draw(rng) for _ in range(2000)]
    assert 185 < statistics.mean(uniform) < 199
    known = dataclasses.replace(low_in_bucket, lengths_sum=100 * 145.0)
    drawn = [known.draw(rng) for _ in range(2000)]
    assert 141 < statistics.mean(drawn) < 149


def test_a_decision_line_carries_what_it_was_sized_from() -> None:
    chat = _chat(rate=0.5, in_flight=3)
    prompts = dataclasses.replace(chat.prompt_tokens, lengths_sum=3 * 40 + 100)
    seen = dataclasses.replace(chat, prompt_tokens=prompts, pending_prompt_tokens=300.0)
    line = json.loads(json.dumps(seen_record(seen)))

    def histogram(raw: dict[str, Any]) -> LengthHistogram:
        return LengthHistogram(tuple(raw["bounds"]), tuple(raw["counts"]), raw["lengths_sum"])

    again = Observation(
        line["seconds"],
        line["arrivals"],
        histogram(line["prompt_tokens"]),
        histogram(line["output_tokens"]),
        in_flight=3,
        pending_prompt_tokens=line["pending_prompt_tokens"],
    )
    assert trace(again, Policy()) == trace(seen, Policy())


def test_the_trace_is_the_observed_rate_with_headroom() -> None:
    requests = trace(_chat(rate=2.0), Policy(headroom=0.5, trace_seconds=200))
    assert 540 < len(requests) < 660  # 3 requests/s over 200 s
    assert all(33 <= r.prompt_tokens <= 128 and 33 <= r.output_tokens <= 64 for r in requests)
    assert requests == trace(_chat(rate=2.0), Policy(headroom=0.5, trace_seconds=200))  # seeded
    assert trace(_chat(rate=0.0), Policy()) == []


def test_a_low_rate_is_simulated_over_enough_arrivals_to_judge_a_share() -> None:
    """At 0.1 req/s, 60 s holds six arrivals: the span grows to hold `min_requests`."""
    short = trace(_chat(rate=0.1), Policy(headroom=0.0, trace_seconds=60, min_requests=0))
    long = trace(_chat(rate=0.1), Policy(headroom=0.0, trace_seconds=60, min_requests=100))
    assert len(short) < 15
    assert 75 < len(long) < 125 and long[-1].arrival_s > 600


@pytest.fixture(scope="module")
def engine() -> EngineConfig:
    return EngineConfig(max_num_seqs=16, max_num_batched_tokens=512)


def _scaler(
    engine: EngineConfig, colocated: bool = False, pod_share: float = 1.0, slo: Slo = SLO
) -> Autoscaler:
    profile = load_profile(PROFILE_OTHER_HOST)
    policy = Policy(max_pods=4, trace_seconds=30, min_requests=0, pod_share=pod_share)
    return Autoscaler(profile, engine, PlacementConfig(), slo, policy, colocated=colocated)


def test_more_load_never_wants_fewer_pods_and_a_tier_keeps_its_mode(engine: EngineConfig) -> None:
    for colocated in (False, True):
        scaler = _scaler(engine, colocated)
        shapes = [scaler.fewest_pods(_chat(rate)) for rate in (0.0, 0.2, 1.0, 4.0)]
        assert shapes[0] == Shape(0 if colocated else 1, 1)  # no load: the smallest
        assert [s.pods for s in shapes] == sorted(s.pods for s in shapes)
        assert shapes[-1].pods > shapes[0].pods  # 4 req/s of chat needs more than the smallest
        assert all((s.prefill == 0) == colocated for s in shapes)
        assert all(s.pods <= 4 for s in shapes)


def test_a_prefill_backlog_counts_beside_the_arrivals(engine: EngineConfig) -> None:
    """A few arrivals a window while long prompts queue: the backlog, prompts waiting at the
    start of the simulated load, asks for more pods than the arrival rate alone."""
    quiet = Observation(30.0, 1.0, _histogram(b1024=1), _histogram(b64=1), in_flight=4)
    backed_up = dataclasses.replace(quiet, pending_prompt_tokens=6000.0)
    waiting = [r for r in trace(backed_up, Policy()) if r.arrival_s == 0.0]
    assert sum(r.prompt_tokens for r in waiting) == 6000 and len(waiting) >= 6
    assert not [r for r in trace(quiet, Policy()) if r.arrival_s == 0.0]
    scaler = _scaler(engine, pod_share=0.5, slo=Slo(2.0, 0.5, PerRequestSlo(2.0, 0.02, 0.5, 0.9)))
    assert scaler.fewest_pods(backed_up).pods > scaler.fewest_pods(quiet).pods


def test_half_core_pods_need_more_of_them_for_the_same_load(engine: EngineConfig) -> None:
    whole, half = _scaler(engine), _scaler(engine, pod_share=0.5)
    load = _chat(1.0)
    assert half.fewest_pods(load).pods > whole.fewest_pods(load).pods


def test_a_per_request_slo_lets_long_prompts_take_their_time(engine: EngineConfig) -> None:
    """Long prompts no split prefills within a 2 s TTFT p90 (so every pod it may have), but
    within 2 s + 10 ms a prompt token, as the benchmarks score them, with fewer pods."""
    long_prompts = Observation(30.0, 6.0, _histogram(b1024=1), _histogram(b64=1), 0)
    by_percentiles = _scaler(engine)
    per_request = _scaler(engine, slo=Slo(2.0, 0.5, PerRequestSlo(2.0, 0.01, 0.5, 0.95)))
    assert by_percentiles.fewest_pods(long_prompts).pods == 4
    assert per_request.fewest_pods(long_prompts).pods < 4


def test_a_per_request_slo_is_met_by_the_share_of_requests_within_their_own() -> None:
    # Apart (10 s between arrivals), 100..400 prompt tokens at 10 ms each: TTFT 1..4 s.
    requests = [TraceRequest(10.0 * i, 100 * (i + 1), 4) for i in range(4)]
    split = Deployment(1, 1, EngineConfig(), EngineConfig(), PlacementConfig())
    profile = dataclasses.replace(
        fixed_step_profile(0.0), model=CostModel((0.0, 0.01, 0.0, 0.001, 0.0))
    )
    half = PerRequestSlo(2.5, 0.0, 10.0, attainment=0.5)  # the first two of four are within
    candidate = evaluate(split, profile, requests, Slo(10.0, 10.0, half))
    assert candidate.attainment == pytest.approx(0.5) and candidate.meets
    stricter = dataclasses.replace(half, attainment=0.75)
    assert not evaluate(split, profile, requests, Slo(10.0, 10.0, stricter)).meets
    by_the_token = dataclasses.replace(half, ttft_per_prompt_token_s=0.01)  # 3.5 s for 100...
    assert evaluate(split, profile, requests, Slo(10.0, 10.0, by_the_token)).attainment == 1.0


def test_the_rates_high_end_is_the_poisson_bound() -> None:
    """Chi-square's exact one-sided 95 % bounds: 2.996 (0 events), 4.744 (1), 16.96 (10)."""
    assert poisson_upper(0) == pytest.approx(2.996, rel=0.01)
    assert poisson_upper(1) == pytest.approx(4.744, rel=0.01)
    assert poisson_upper(10) == pytest.approx(16.96, rel=0.01)
    assert _chat(0.0, in_flight=1).rate_upper == pytest.approx(2.996 / 30, rel=0.01)  # none seen
    assert _chat(rate=2.0).rate < _chat(rate=2.0).rate_upper < 2.0 * 1.3  # 60 seen: near


def test_the_rates_low_end_is_the_poisson_bound() -> None:
    """Chi-square's exact one-sided 95 % bounds: 0.355 (2 events), 5.425 (10), 10.04 (16); one
    event's 0.051 is approximated low (0.040), none gives 0."""
    assert poisson_lower(0) == 0.0
    assert poisson_lower(1) == pytest.approx(0.051, rel=0.25)
    assert poisson_lower(2) == pytest.approx(0.355, rel=0.03)
    assert poisson_lower(10) == pytest.approx(5.425, rel=0.01)
    assert poisson_lower(16) == pytest.approx(10.04, rel=0.01)
    assert _chat(rate=2.0).rate * 0.75 < _chat(rate=2.0).rate_lower < _chat(rate=2.0).rate


def _fixed(*shapes: Shape) -> Autoscaler:
    """An autoscaler whose load wants the given shapes, one per interval, at either rate."""
    wanted = iter(shapes)
    this_interval: list[Shape] = []

    def per_interval(observation: Observation, rate: float, keep: Shape) -> Shape:
        if rate == observation.rate:  # asked first each interval; the high end, if asked, next
            this_interval[:] = [next(wanted)]
        return this_interval[0]

    return Autoscaler(
        load_profile(PROFILE_OTHER_HOST),
        EngineConfig(max_num_seqs=8),
        PlacementConfig(),
        SLO,
        Policy(down_after=2),
        wanted=per_interval,
    )


def _by_rate(engine: EngineConfig, asked: list[float]) -> Autoscaler:
    """An autoscaler whose load wants one more decode pod per 1 req/s (1P1D below 1 req/s); the
    rates it was asked about go to `asked`."""

    def per_rate(observation: Observation, rate: float, keep: Shape) -> Shape:
        asked.append(rate)
        return Shape(1, 1 + math.floor(rate))

    return Autoscaler(
        load_profile(PROFILE_OTHER_HOST), engine, PlacementConfig(), SLO, wanted=per_rate
    )


def test_down_only_when_the_rates_high_end_wants_fewer(engine: EngineConfig) -> None:
    """The mean scales up; the rate's high end scales down: a window with no trace of the busy
    phase at once, a lull of a few arrivals not (the mean alone would take either as fewer)."""
    asked: list[float] = []
    scaler = _by_rate(engine, asked)
    busy = scaler.decide(_chat(2.5), Shape(1, 1))  # 75 in 30 s
    assert (busy.action, busy.shape) == (Action.SCALE_UP, Shape(1, 3)) and busy.wanted_upper is None
    calmer = scaler.decide(_chat(1.5), Shape(1, 3))  # 45 in 30 s: at most 1.92 req/s
    assert (calmer.action, calmer.shape) == (Action.SCALE_DOWN, Shape(1, 2))
    lull = scaler.decide(_chat(0.8), Shape(1, 2))  # 24 in 30 s: mean 0.8, at most 1.13
    assert (lull.action, lull.wanted, lull.wanted_upper) == (Action.HOLD, Shape(1, 1), Shape(1, 2))
    quiet = scaler.decide(_chat(0.0, in_flight=3), Shape(1, 2))  # none in 30 s: at most 0.1
    assert (quiet.action, quiet.shape) == (Action.SCALE_DOWN, Shape(1, 1))
    assert asked[-1] == pytest.approx(2.996 / 30, rel=0.01)
    idle = scaler.decide(_chat(0.0), Shape(1, 2))  # and nothing running: the load is over
    assert (idle.action, idle.shape) == (Action.SCALE_DOWN, Shape(1, 1)) and asked[-1] == 0.0


def _decisions(scaler: Autoscaler, current: Shape, count: int) -> list[tuple[Action, Shape]]:
    """`count` decisions in a row, each applied before the next."""
    decisions = []
    for _ in range(count):
        decision = scaler.decide(_chat(1.0), current)
        decisions.append((decision.action, decision.shape))
        current = decision.shape
    return decisions


def test_up_at_once_down_after_a_run_of_quieter_intervals_to_the_most_they_wanted() -> None:
    scaler = _fixed(Shape(1, 3), Shape(1, 2), Shape(1, 1), Shape(1, 1), Shape(2, 1))
    assert _decisions(scaler, Shape(1, 1), 5) == [
        (Action.SCALE_UP, Shape(1, 3)),  # at once
        (Action.WAIT_DOWN, Shape(1, 3)),
        (Action.SCALE_DOWN, Shape(1, 2)),  # the most of the two quieter intervals
        (Action.WAIT_DOWN, Shape(1, 2)),
        (Action.SCALE_UP, Shape(2, 2)),  # prefill up; decode is not cut on the way
    ]


def test_never_below_the_slots_the_live_streams_need() -> None:
    scaler = _fixed(Shape(1, 1), Shape(1, 1), Shape(1, 1))
    decisions = [scaler.decide(_chat(0.1, in_flight=20), Shape(1, 4)) for _ in range(3)]
    assert [d.floor for d in decisions] == [Shape(1, 3)] * 3  # 20 streams, 8 slots a pod
    assert [d.action for d in decisions] == [Action.WAIT_DOWN, Action.SCALE_DOWN, Action.WAIT_DOWN]
    assert decisions[1].shape == Shape(1, 3)


def _decode_steps(profile_seconds_times: float, pod_share: float = 1.0) -> Observation:
    """A chat interval whose decode pods measured their steps at `profile_seconds_times` what
    the profile predicts for a pod of `pod_share`."""
    profile = load_profile(PROFILE_OTHER_HOST)
    work = StepShape.decodes(num_seqs=8 * 32, context_tokens=8 * 32 * 200)  # 32 steps of 8
    window = StepWindow(StepPhase.DECODE, 32, work, 0.0)
    measured = predicted_seconds(profile, window) / pod_share * profile_seconds_times
    seen = _chat(1.0)
    windows = {"decode": (dataclasses.replace(window, seconds=measured),)}
    return dataclasses.replace(seen, step_windows=windows)


def test_measured_steps_correct_their_tier_at_the_pods_share(engine: EngineConfig) -> None:
    half = _scaler(engine, pod_share=0.5)
    as_profiled = half.correction(_decode_steps(1.0, pod_share=0.5))
    assert as_profiled.decode == pytest.approx(1.0) and as_profiled.prefill == 1.0
    assert half.correction(_decode_steps(3.0, pod_share=0.5)).decode == pytest.approx(3.0)
    few = dataclasses.replace(
        _chat(1.0), step_windows={"decode": (StepWindow(StepPhase.DECODE, 2, StepShape(), 1.0),)}
    )
    assert half.correction(few).decode == 1.0  # too few steps: uncorrected


def test_pods_slower_than_profiled_need_more_of_them(engine: EngineConfig) -> None:
    scaler = _scaler(engine)
    as_profiled = scaler.fewest_pods(_decode_steps(1.0))
    slower = scaler.fewest_pods(_decode_steps(4.0))
    assert slower.decode > as_profiled.decode and slower.prefill == as_profiled.prefill
    assert scaler.decide(_decode_steps(4.0), as_profiled).correction.decode == pytest.approx(4.0)


def test_raising_one_tier_keeps_the_other_only_within_max_pods() -> None:
    scaler = _fixed(Shape(1, 3), Shape(1, 3), Shape(2, 2))
    assert scaler.policy.max_pods == 4
    scaler.decide(_chat(1.0), Shape(3, 1))  # a rebalance: it waits for a second decision
    up = scaler.decide(_chat(1.0), Shape(3, 1))  # 3P3D would be six pods
    assert (up.action, up.shape) == (Action.SCALE_UP, Shape(1, 3))
    up = scaler.decide(_chat(1.0), Shape(1, 1))
    assert (up.action, up.shape) == (Action.SCALE_UP, Shape(2, 2))


def test_the_last_window_alone_may_add_pods_but_not_move_or_remove_them() -> None:
    """A phase that has just begun is diluted in the longer view: what the last window wants
    counts when it adds pods, and only then."""
    view, newest = _chat(0.1, seconds=120.0), _chat(0.3)
    wants = {id(view): Shape(1, 1), id(newest): Shape(2, 1)}
    scaler = Autoscaler(
        load_profile(PROFILE_OTHER_HOST),
        EngineConfig(max_num_seqs=8),
        PlacementConfig(),
        SLO,
        wanted=lambda observation, rate, keep: wants[id(observation)],
    )
    up = scaler.decide(view, Shape(1, 1), newest)
    assert (up.action, up.shape, up.wanted) == (Action.SCALE_UP, Shape(2, 1), Shape(2, 1))
    assert scaler.decide(view, Shape(1, 1)).action == Action.HOLD  # the view alone
    assert scaler.decide(view, Shape(1, 1), view).action == Action.HOLD  # the view is the window
    wants.update({id(view): Shape(3, 1), id(newest): Shape(2, 2)})  # at max_pods: a move
    assert scaler.decide(view, Shape(3, 1), newest).action == Action.HOLD


def test_the_last_window_is_sized_at_the_low_end_of_its_rate(engine: EngineConfig) -> None:
    """One window's few arrivals say little about a rate: sized at their mean, a chance burst
    added pods for minutes. The view's mean, or the window's low end, adds them."""
    asked: list[float] = []
    scaler = _by_rate(engine, asked)
    view, burst = _chat(1.0, seconds=120.0), _chat(2.4, seconds=15.0)  # 36 arrivals in 15 s
    decision = scaler.decide(view, Shape(1, 2), burst)
    assert asked[-1] == pytest.approx(burst.rate_lower) and burst.rate_lower < 2.0
    assert decision.action == Action.HOLD  # 2.4 req/s at its mean would want 1P3D
    sustained = _chat(3.2, seconds=15.0)  # 48 arrivals: even the low end is past 2 req/s
    assert scaler.decide(view, Shape(1, 2), sustained).shape == Shape(1, 3)


def test_pods_move_between_tiers_only_when_decisions_in_a_row_want_it() -> None:
    """At max_pods a tier is raised by cutting the other: that waits for a second decision
    wanting it, and a decision between that wants the current split starts over."""
    scaler = _fixed(Shape(2, 2), Shape(3, 1), Shape(2, 2), Shape(2, 2))
    assert _decisions(scaler, Shape(3, 1), 4) == [
        (Action.WAIT_REBALANCE, Shape(3, 1)),
        (Action.HOLD, Shape(3, 1)),  # the flip did not hold
        (Action.WAIT_REBALANCE, Shape(3, 1)),
        (Action.SCALE_UP, Shape(2, 2)),  # two in a row
    ]


def test_a_split_that_still_meets_is_kept_rather_than_flipped(
    engine: EngineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator faked: 1P1D never meets; 2P1D and 1P2D meet with TTFTs set per interval."""
    ttft: dict[Shape, float] = {}
    meets: dict[Shape, bool] = {Shape(1, 1): False}

    def simulated(deployment: Deployment, *_: object, **__: object) -> Candidate:
        shape = Shape(deployment.num_prefill, deployment.num_decode)
        fits = meets.get(shape, True)
        return Candidate(deployment, ttft.get(shape, 9.0), 0.1, 1.0, 1.0, 0.0, 0.0, 0.0, fits)

    monkeypatch.setattr(autoscale, "evaluate", simulated)
    scaler = _scaler(engine)
    ttft.update({Shape(2, 1): 0.5, Shape(1, 2): 0.9})
    assert scaler.decide(_chat(1.0), Shape(1, 1)).wanted == Shape(2, 1)  # the lowest TTFT
    ttft.update({Shape(2, 1): 0.9, Shape(1, 2): 0.5})
    assert scaler.decide(_chat(1.0), Shape(2, 1)).wanted == Shape(2, 1)  # still meets: kept
    meets[Shape(2, 1)] = False
    assert scaler.decide(_chat(1.0), Shape(2, 1)).wanted == Shape(1, 2)  # no longer meets


def test_streams_in_flight_are_drawn_mid_output_and_seeded() -> None:
    seen = _chat(rate=0.5, in_flight=40)
    streams = autoscale.streams_in_flight(seen, Policy())
    assert len(streams) == 40 and streams == autoscale.streams_in_flight(seen, Policy())
    # Context: a prompt of (32, 128] and the tokens so far; to go: 1 to the whole output.
    assert all(33 <= s.prompt_tokens <= 128 + 63 and 1 <= s.output_tokens <= 64 for s in streams)
    assert all(s.arrival_s == 0.0 for s in streams)
    assert autoscale.streams_in_flight(_chat(rate=0.5), Policy()) == []


def test_streams_in_flight_ask_for_decode_beside_the_arrivals(engine: EngineConfig) -> None:
    """15 streams in flight fit one decode pod's 16 slots (the floor), but their steps slow every
    new stream: the same arrivals with them want a decode pod more."""
    scaler = _scaler(engine)
    prompts, outputs = _histogram(b128=3, b2048=1), _histogram(b256=1)
    quiet = Observation(30.0, 9.0, prompts, outputs, in_flight=0)
    busy = dataclasses.replace(quiet, in_flight=15)
    assert scaler.floor(busy).decode == 1
    assert scaler.fewest_pods(busy).decode > scaler.fewest_pods(quiet).decode
