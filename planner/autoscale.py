"""The autoscaler's decision: from what the recent load showed (arrivals, the length mix, the
streams in flight), the fewest prefill and decode pods that the simulator says meet the SLOs at
that load plus headroom, and when to apply it.

The prediction is `pdserve plan`'s own (planner/plan.py `deployments` and `evaluate`: the cluster
simulator with the router's placement rule), restricted to what a running cluster can change:
its pod counts. The engine settings and the placement rule stay the cluster's, and a cluster
started with a prefill tier keeps one (one started colocated stays so), as `pdserve scale`
allows. The load is the streams in flight (decoding from the start, unscored:
`streams_in_flight`), the workers' backlog (their prompt tokens still to compute, as prompts
waiting at the start) and then a Poisson trace at the observed arrival rate times
(1 + headroom), its prompt and output lengths drawn from the interval's histograms (the router's
`pdserve_router_admitted_prompt_tokens` and `pdserve_router_output_tokens`), seeded, so the same
observation gives the same answer.

What the workers measured corrects the profile (`tier_correction`): the router exports each
worker's recent steps (`pdserve_router_step_window`), and the ratio of their measured time to what
the profile predicts for the same steps at the pods' CPU share, pooled per tier, scales that
tier's simulated pods (a factor of 2: each pod serves half what the profile says). As Dynamo's SLA
planner corrects its prefill and decode predictions by measured / predicted; per tier because the
simulator's pods are per tier, and a profile from another host or backend is wrong by a scale
(costmodel/correction.py says why a ratio rather than a refit).

When to act (`Autoscaler.decide`), on the arrivals of the view it is given (the lookback of two
minutes while they read as one steady rate, its newest part once the rate changed there:
planner/autoscale_view.py) read two ways:
- up at once when the view's mean rate wants more pods in a tier, or the last window's alone
  wants pods added at the low end of the rate its arrivals allow (`Observation.rate_lower`: a
  missed SLO costs now, but one window's chance burst is no phase; the other tier kept as it is
  unless that passes `max_pods`);
- down only when even the high end of the rate those arrivals allow (`Observation.rate_upper`,
  planner/autoscale_observation.py: a one-sided 95 % Poisson bound; 0 once the window is idle: no
  arrival, stream or backlog) wants fewer, for `down_after` intervals in a row, to the most any of
  them wanted. A few arrivals say little about a rate: 1 in 30 s allows up to 0.16 req/s, 60 in 30 s
  2.5 req/s at most. So a lull between two arrivals of a low-rate phase keeps the pods, while a view
  that holds no trace of a busy phase lets them go at once, and the band between the two readings
  keeps a steady load from scaling up and back down;
- pods moved between the tiers (as many or fewer in all, one tier up) only once
  `rebalance_after` decisions in a row wanted that: near capacity the simulated verdict on two
  splits of as many pods flips from one decision to the next;
- never below the floor the live streams need (decode slots for every stream in flight: a
  scale-in moves streams, it must not strand them).
A load no deployment within `max_pods` meets gets the largest one tried. Among the splits of the
fewest pods that meet, the one closest to the current shape is kept (at a few arrivals a window
the best split flips between, say, 3P1D and 1P3D, and each flip moves two pods for no gain).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from pdserve.core.config import EngineConfig
from pdserve.costmodel.correction import MIN_STEPS, StepWindow, predicted_seconds
from pdserve.costmodel.profile import Profile
from pdserve.planner.autoscale_observation import Observation
from pdserve.planner.plan import Candidate, SearchSpace, Slo, deployments, evaluate
from pdserve.planner.sim_cluster import Deployment
from pdserve.planner.workload import TraceRequest
from pdserve.router.placement.prefill_place import PlacementConfig


@dataclass(frozen=True)
class Shape:
    """Pod counts of the two tiers."""

    prefill: int
    decode: int

    @property
    def pods(self) -> int:
        return self.prefill + self.decode

    def at_least(self, other: Shape) -> Shape:
        return Shape(max(self.prefill, other.prefill), max(self.decode, other.decode))

    def __str__(self) -> str:
        return f"{self.prefill}P{self.decode}D"


@dataclass(frozen=True)
class Policy:
    headroom: float = 0.25  # sized for the observed rate x (1 + headroom)
    # Intervals in a row whose rate's high end wanted fewer pods before any leaves (the bound is
    # the guard against lulls; more intervals trade a later scale-in for fewer wrong ones).
    down_after: int = 1
    max_pods: int = 4  # prefill + decode
    # Decisions in a row that wanted pods moved between the tiers (none added) before any moves:
    # near what the pods can serve, the simulated verdict on two splits of as many pods flips
    # from one decision to the next (3P1D predicted 0.96, 0.19, 0.95, 0.08 at four in a row of
    # a full trace run), and each flip drains a pod and migrates its streams for nothing.
    rebalance_after: int = 2
    trace_seconds: float = 60.0  # the simulated load's span, at least
    # ... and long enough to hold this many arrivals: an attainment of 0.95 judged on the five
    # arrivals of 60 s at 0.09 req/s reads one miss as 0.8 and sees a chat prompt queued behind a
    # long one (a 1P1D prefill pod busy 40 % of a surge) only by chance.
    min_requests: int = 100
    seed: int = 0
    # The share of the profiled worker (one core) each pod gets: its --pod-cpus, up to 1 (a 0.5
    # pod serves half what a 1.0 pod does: docs/elasticity.md).
    pod_share: float = 1.0


@dataclass(frozen=True)
class TierCorrection:
    """Measured / predicted step time of each tier's pods (1: not measured yet)."""

    prefill: float = 1.0
    decode: float = 1.0


def tier_correction(profile: Profile, windows: Iterable[StepWindow], pod_share: float) -> float:
    """Measured / predicted for a tier's steps, pooled over its workers and phases; the prediction
    is at the pods' share of the profiled worker, as the simulator runs them."""
    windows = list(windows)
    measured = sum(window.seconds for window in windows)
    predicted = sum(predicted_seconds(profile, window) for window in windows) / pod_share
    if sum(window.steps for window in windows) < MIN_STEPS or measured <= 0 or predicted <= 0:
        return 1.0
    return measured / predicted


class Action(enum.Enum):
    HOLD = "hold"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    WAIT_DOWN = "wait_down"  # wants fewer, not for long enough yet
    WAIT_REBALANCE = "wait_rebalance"  # wants pods moved between tiers, not for long enough yet


@dataclass(frozen=True)
class Decision:
    action: Action
    shape: Shape  # what to scale to (the current shape unless the action scales)
    wanted: Shape  # what this interval's load at its mean rate wanted
    floor: Shape  # what the live streams need
    correction: TierCorrection  # what the simulated pods were scaled by
    # What the rate's high end wanted (asked only when the mean wanted fewer pods).
    wanted_upper: Shape | None = None


def trace(
    observation: Observation, policy: Policy, rate: float | None = None
) -> list[TraceRequest]:
    """The load to size for: the workers' backlog, as prompts waiting at its start, then Poisson
    arrivals at `rate` (default: the observed one) x (1 + headroom), over `trace_seconds` or
    the span that holds `min_requests` of them, the longer."""
    if not observation.prompt_tokens.total or not observation.output_tokens.total:
        return []
    rng = random.Random(policy.seed)
    requests = _backlog(observation, rng)
    rate = (observation.rate if rate is None else rate) * (1 + policy.headroom)
    if rate <= 0:
        return requests
    span = max(policy.trace_seconds, policy.min_requests / rate)
    arrival = rng.expovariate(rate)
    while arrival < span:
        prompt = observation.prompt_tokens.draw(rng)
        output = observation.output_tokens.draw(rng)
        requests.append(TraceRequest(arrival, prompt, output))
        arrival += rng.expovariate(rate)
    return requests


def streams_in_flight(observation: Observation, policy: Policy) -> list[TraceRequest]:
    """The streams running at the window's end, for the simulation to start with (decoding on
    the decode tier, unscored): lengths drawn from the window's histograms, each stream met at a
    uniformly drawn point of its output (its context the prompt and the tokens so far). Without
    them a window was sized as if every stream had ended: 10 streams in flight at half-core
    pods were only in the floor (decode slots), not in the steps' time."""
    if not observation.prompt_tokens.total or not observation.output_tokens.total:
        return []
    rng = random.Random(policy.seed + 1)  # apart from the arrivals' draws (`trace`)
    streams = []
    for _ in range(observation.in_flight):
        prompt = observation.prompt_tokens.draw(rng)
        output = observation.output_tokens.draw(rng)
        left = rng.randint(1, output)
        streams.append(TraceRequest(0.0, prompt + output - left, left))
    return streams


def _backlog(observation: Observation, rng: random.Random) -> list[TraceRequest]:
    """The pending prompt tokens as prompts of the observed lengths, all waiting at 0."""
    requests, left = [], round(observation.pending_prompt_tokens)
    while left > 0:
        prompt = min(observation.prompt_tokens.draw(rng), left)
        requests.append(TraceRequest(0.0, prompt, observation.output_tokens.draw(rng)))
        left -= prompt
    return requests


class Autoscaler:
    """Decides each interval's shape for one cluster (see the module's docstring)."""

    def __init__(
        self,
        profile: Profile,
        engine: EngineConfig,
        placement: PlacementConfig,
        slo: Slo,
        policy: Policy = Policy(),
        colocated: bool = False,
        wanted: Callable[[Observation, float, Shape], Shape] | None = None,
    ) -> None:
        self.profile = profile
        self.engine = engine
        self.placement = placement
        self.slo = slo
        self.policy = policy
        self.colocated = colocated
        self._wanted = wanted or self.fewest_pods
        self._fewer_in_a_row: list[Shape] = []
        self._rebalances_in_a_row = 0

    def floor(self, observation: Observation) -> Shape:
        decode = max(1, math.ceil(observation.in_flight / self.engine.max_num_seqs))
        return Shape(0 if self.colocated else 1, decode)

    def correction(self, observation: Observation) -> TierCorrection:
        share = self.policy.pod_share
        windows = observation.step_windows
        return TierCorrection(
            prefill=tier_correction(self.profile, windows.get("prefill", ()), share),
            decode=tier_correction(self.profile, windows.get("decode", ()), share),
        )

    def fewest_pods(
        self, observation: Observation, rate: float | None = None, keep: Shape | None = None
    ) -> Shape:
        """The fewest pods whose simulation meets both SLOs at the observation's load, arriving
        at `rate` (default: the observed one); of those, the split closest to `keep` (the
        smallest shape for no load; at `max_pods`, the one that misses least when none meets)."""
        requests = trace(observation, self.policy, rate)
        smallest = Shape(0 if self.colocated else 1, 1)
        if not requests:
            return smallest
        streams = streams_in_flight(observation, self.policy)
        correction = self.correction(observation)
        tried: list[Candidate] = []
        for total in range(smallest.pods, self.policy.max_pods + 1):
            tried = [
                evaluate(deployment, self.profile, requests, self.slo, streams=streams)
                for deployment in self._deployments(total, requests, correction)
            ]
            meeting = [candidate for candidate in tried if candidate.meets]
            if meeting:
                return _closest_or_best(meeting, keep)
        return _shape(min(tried, key=self._miss)) if tried else smallest

    def _miss(self, candidate: Candidate) -> float:
        """How far a candidate is from meeting, unfinished requests first: the share of requests
        missing their own SLOs, or (by percentiles) its worse SLO ratio."""
        unfinished = (1 - candidate.completed_fraction) * 1e6
        if self.slo.per_request is not None:
            return unfinished + 1 - candidate.attainment
        ratio = max(
            candidate.ttft_p90 / self.slo.ttft_p90_s, candidate.itl_p99 / self.slo.itl_p99_s
        )
        return unfinished + ratio

    def _deployments(
        self, total: int, requests: Sequence[TraceRequest], correction: TierCorrection
    ) -> list[Deployment]:
        space = SearchSpace(
            max_workers=total,
            max_num_seqs=(self.engine.max_num_seqs,),
            chunk_budgets=(self.engine.max_num_batched_tokens,),
            placements=(self.placement.mode,),
        )
        prefill_share = self.policy.pod_share / correction.prefill
        decode_share = self.policy.pod_share / correction.decode
        return [
            replace(
                d,
                placement=self.placement,
                prefill_share=prefill_share,
                decode_share=decode_share,
            )
            for d in deployments(total, self.engine, space, list(requests))
            if (d.num_prefill == 0) == self.colocated
            and d.placement.disagg_threshold == 0  # one per split: the cluster's rule replaces it
        ]

    def decide(
        self, observation: Observation, current: Shape, newest: Observation | None = None
    ) -> Decision:
        """`observation`: the view sized for; `newest`: the last window alone, when the view is
        longer (planner/autoscale_view.py), asked only for pods to add."""
        floor = self.floor(observation)
        wanted = self._wanted(observation, observation.rate, current).at_least(floor)
        if newest is not None and newest is not observation:
            wanted = self._fresher(wanted, newest, current, floor)
        correction = self.correction(observation)
        if _more_in_a_tier(wanted, current):
            self._fewer_in_a_row.clear()
            action, shape = self._up(self._raised(wanted, current), current)
            return Decision(action, shape, wanted, floor, correction)
        self._rebalances_in_a_row = 0
        if wanted == current:  # the high end of the rate wants at least what its mean does
            self._fewer_in_a_row.clear()
            return Decision(Action.HOLD, current, wanted, floor, correction)
        upper = self._wanted(observation, observation.rate_upper, current).at_least(floor)
        action, shape = self._down(upper, current)
        return Decision(action, shape, wanted, floor, correction, upper)

    def _fresher(self, wanted: Shape, newest: Observation, current: Shape, floor: Shape) -> Shape:
        """What the last window wants instead, when only it adds pods: a longer view dilutes
        a phase that has just begun with the one before it (the surge's first long prompts
        among two minutes of chat), and a missed SLO costs now; pods leave on the longer view
        only (`_down`). Sized at the low end of the rate its arrivals allow
        (`Observation.rate_lower`), as pods leave only at the high end: at its mean, one
        window's chance burst (16 arrivals in 18 s of a 0.5 req/s phase) or its lone long
        prompt (the whole simulated mix then long, at 0.06 req/s) added pods that a full trace
        run kept for minutes (the high phase at four pods where two attained 0.98)."""
        if _more_in_a_tier(wanted, current):
            return wanted
        fresh = self._wanted(newest, newest.rate_lower, current).at_least(floor)
        return fresh if self._raised(fresh, current).pods > current.pods else wanted

    def _up(self, raised: Shape, current: Shape) -> tuple[Action, Shape]:
        """Added pods at once (a missed SLO costs now); pods only moved between the tiers once
        `rebalance_after` decisions in a row wanted that."""
        if raised.pods > current.pods:
            self._rebalances_in_a_row = 0
            return Action.SCALE_UP, raised
        self._rebalances_in_a_row += 1
        if self._rebalances_in_a_row < self.policy.rebalance_after:
            return Action.WAIT_REBALANCE, current
        self._rebalances_in_a_row = 0
        return Action.SCALE_UP, raised

    def _raised(self, wanted: Shape, current: Shape) -> Shape:
        """The other tier is not cut on the way up, unless keeping it would pass max_pods."""
        raised = wanted.at_least(current)
        return raised if raised.pods <= self.policy.max_pods else wanted

    def _down(self, upper: Shape, current: Shape) -> tuple[Action, Shape]:
        """Fewer pods once the rate's high end wanted fewer `down_after` times in a row."""
        if upper == current or _more_in_a_tier(upper, current):
            self._fewer_in_a_row.clear()
            return Action.HOLD, current
        self._fewer_in_a_row.append(upper)
        if len(self._fewer_in_a_row) < self.policy.down_after:
            return Action.WAIT_DOWN, current
        target = self._fewer_in_a_row[0]
        for shape in self._fewer_in_a_row[1:]:
            target = target.at_least(shape)
        self._fewer_in_a_row.clear()
        return Action.SCALE_DOWN, target


def _more_in_a_tier(wanted: Shape, current: Shape) -> bool:
    return wanted.prefill > current.prefill or wanted.decode > current.decode


def _closest_or_best(meeting: Sequence[Candidate], keep: Shape | None) -> Shape:
    """Of splits that meet, the one moving the fewest pods from `keep`, then the highest
    attainment and lowest TTFT p90."""

    def moves(candidate: Candidate) -> int:
        shape = _shape(candidate)
        if keep is None:
            return 0
        return abs(shape.prefill - keep.prefill) + abs(shape.decode - keep.decode)

    return _shape(min(meeting, key=lambda c: (moves(c), -c.attainment, c.ttft_p90)))


def _shape(candidate: Candidate) -> Shape:
    return Shape(candidate.deployment.num_prefill, candidate.deployment.num_decode)
