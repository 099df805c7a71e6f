"""A discrete-event simulation of the router and its prefill and decode workers.

The router does what `router/dispatch.py` does, with its least-loaded choice
(`router/placement/worker_choice.py`) made on exact loads instead of polled ones: pick a decode
worker, Reserve the prompt's blocks there; once granted, pick a prefill worker and send it the
prompt; when prefill finishes, its KV crosses to decode (wire + scatter from the profile) and decode
admits the request at its next loop turn, which is when the client sees the first token. In
colocated mode (no prefill workers) and, with a disaggregation threshold, for prompts shorter than
it, the prompt goes straight to a decode worker and is prefilled there in chunks inside its
continuous batch. That choice is made by the router's own rule (`router/placement/prefill_place.py`
`place_prefill`) with the router's own settings (`PlacementConfig`: `--disagg-threshold`,
`--max-prefill-queue`, and their defaults). Under `--placement adaptive` the router's cost-model
choice (`router/placement/adaptive.py` `place_adaptive`, the same function) picks the workers too,
from the workers' exact loads: local on a decode worker, local on a prefill worker it lends streams
(taken back once they are done, as router/placement/roles.py does), or remote from a given prefill
worker to a given decode worker. With `itl_slo_s` every worker's scheduler caps its steps' prompt
tokens (costmodel/step_budget.py), as workers started with `--itl-slo` do. With `admission` (the
router's `--slo-ttft` / `--slo-tpot`) a request predicted to miss its SLO is refused on arrival,
by the router's own prediction and verdict (`router/slo_admission.py` `predict` and `judge`, the
same functions) on the workers' exact loads, for its actual output length (the router forecasts
it; the simulation knows it).

Each request's prompt is its own but for the prefix its trace line shares (`sim_worker`), so the
workers' prefix caches hit where the real ones would, on both tiers: a decode worker's
reservation takes the cached prefix and prefill neither gathers nor sends those blocks.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.sched.scheduler import Scheduler
from pdserve.costmodel.profile import Profile
from pdserve.costmodel.step_budget import ItlMode, StepCosts, WorkerStepBudget
from pdserve.planner.sim_worker import Journey, Role, SharedCore, SimWorker, UsageSample
from pdserve.planner.workload import TraceRequest
from pdserve.router.placement.adaptive import WorkerRole, WorkerState, place_adaptive
from pdserve.router.placement.arrival_rate import ArrivalRate
from pdserve.router.placement.prefill_place import (
    PlacementConfig,
    PlacementMode,
    PrefillPlace,
    PrefillTierState,
    place_prefill,
)
from pdserve.router.slo_admission import Slo, judge, predict


@dataclass(frozen=True)
class Deployment:
    num_prefill: int
    num_decode: int
    prefill_config: EngineConfig = field(default_factory=EngineConfig)
    decode_config: EngineConfig = field(default_factory=EngineConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)  # the router's rule
    # Fraction of the profiled device each worker of a tier gets (a pod's CPU quota: 0.5 for
    # half-core pods).
    prefill_share: float = 1.0
    decode_share: float = 1.0
    # Each tier's workers pinned to one core of its own, shared as the kernel shares it
    # (sim_worker.SharedCore), as the 2-core validation runs pin them.
    one_core_per_tier: bool = False
    itl_slo_s: float | None = None  # the workers' (and router's) --itl-slo
    itl_slo_mode: ItlMode = ItlMode.STEP  # the workers' --itl-slo-mode
    admission: Slo | None = None  # the router's --slo-ttft / --slo-tpot (None: admit everything)

    def __post_init__(self) -> None:
        if self.num_prefill < 0:
            raise ValueError(f"prefill: must be >= 0, got {self.num_prefill}")
        if self.num_decode < 1:
            raise ValueError(f"decode: must be >= 1, got {self.num_decode}")

    @property
    def name(self) -> str:
        name = f"{self.num_prefill}P{self.num_decode}D"
        if self.adaptive:
            return name + " A"
        threshold = self.placement.disagg_threshold if self.num_prefill else 0
        return name + (f" T{threshold}" if threshold else "")

    @property
    def adaptive(self) -> bool:
        return self.placement.mode is PlacementMode.ADAPTIVE

    def costs(self, profile: Profile) -> StepCosts:
        """The cost model the router predicts with (the decode tier's chunk budget)."""
        return StepCosts(profile, self.decode_config.max_num_batched_tokens, self.itl_slo_s)

    def place(self, prompt_tokens: int, prefill_in_flight: int) -> PrefillPlace:
        tier = PrefillTierState(self.num_prefill, prefill_in_flight)
        placement = self.placement
        return place_prefill(
            prompt_tokens, placement.disagg_threshold, placement.max_prefill_queue, tier
        ).place


@dataclass(frozen=True)
class SimResult:
    journeys: tuple[Journey, ...]
    usage: tuple[UsageSample, ...]
    num_steps: int
    num_preemptions: int
    end_s: float  # when the last event happened
    # Prompt tokens looked up in the workers' prefix caches (both tiers), and those found there.
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0


class ClusterSim:
    def __init__(
        self,
        deployment: Deployment,
        profile: Profile,
        scheduler_class: type[Scheduler] = Scheduler,
    ) -> None:
        self.deployment = deployment
        self.profile = profile
        self._events: list[tuple[float, int, Callable[[float], None]]] = []
        self._order = itertools.count()
        self.now = 0.0
        self._arrivals = ArrivalRate()  # the router's count of requests placed, on this clock
        prefill_core, decode_core = (
            (SharedCore(), SharedCore()) if deployment.one_core_per_tier else (None, None)
        )
        self.prefill = [
            SimWorker(
                f"prefill-{i}",
                Role.PREFILL,
                deployment.prefill_config,
                profile,
                self.at,
                scheduler_class,
                deployment.prefill_share,
                core=prefill_core,
            )
            for i in range(deployment.num_prefill)
        ]
        self.decode = [
            SimWorker(
                f"decode-{i}",
                Role.DECODE,
                deployment.decode_config,
                profile,
                self.at,
                scheduler_class,
                deployment.decode_share,
                core=decode_core,
            )
            for i in range(deployment.num_decode)
        ]
        for worker in self.prefill:
            worker.on_prefilled = self._prefilled
        if deployment.itl_slo_s is not None:
            for worker in self.prefill + self.decode:
                config = worker.config.max_num_batched_tokens
                costs = StepCosts(profile, config, deployment.itl_slo_s, deployment.itl_slo_mode)
                worker.scheduler.step_budget = WorkerStepBudget(costs, clock=lambda: self.now)
        self._costs = deployment.costs(profile)
        self._lent: set[str] = set()  # prefill workers lent streams (adaptive)
        self._decode_of: dict[str, SimWorker] = {}
        self._prefill_in_flight = 0  # Prefill calls sent and not answered (the router's count)
        self._turns = itertools.count()

    def at(self, time: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._events, (time, next(self._order), action))

    def run(
        self, requests: Sequence[TraceRequest], streams: Sequence[TraceRequest] = ()
    ) -> SimResult:
        """Runs `requests`. `streams`: requests already decoding at 0 on the decode tier (their
        `prompt_tokens` the context so far, KV in place; `output_tokens` the tokens still to
        come), least loaded first: they load the decode workers and are not in the result."""
        ordered = sorted(requests, key=lambda r: r.arrival_s)
        journeys = [Journey.of(index, request) for index, request in enumerate(ordered)]
        for index, stream in enumerate(streams, start=len(journeys)):
            self._decoding(Journey.of(index, stream))
        # A request reaches the router's choice after its dispatch latency (the serving costs'
        # share of the way in that no worker's step accounts for).
        dispatch = self.profile.serving.dispatch_s
        for journey in journeys:
            self.at(journey.arrival_s + dispatch, functools.partial(self._arrive, journey))
        while self._events:
            self.now, _, action = heapq.heappop(self._events)
            action(self.now)
        workers = self.prefill + self.decode
        return SimResult(
            journeys=tuple(journeys),
            usage=tuple(sorted((u for w in workers for u in w.usage), key=lambda u: u.time)),
            num_steps=sum(w.num_steps for w in workers),
            num_preemptions=sum(w.scheduler.num_preemptions for w in workers),
            end_s=self.now,
            prefix_query_tokens=sum(w.kv_manager.num_prefix_query_tokens for w in workers),
            prefix_hit_tokens=sum(w.kv_manager.num_prefix_hit_tokens for w in workers),
        )

    def _decoding(self, journey: Journey) -> None:
        """A stream decoding at 0: its KV lands in a reservation on the least loaded decode
        worker, with no prefill."""
        decode = self._least_loaded(self.decode)
        decode.reserve(0.0, journey, lambda at: decode.kv_landed(at, journey))

    def _arrive(self, journey: Journey, now: float) -> None:
        if self._refused(journey):
            return
        if self.deployment.adaptive:
            self._arrive_adaptive(journey, now)
            return
        decode = self._least_loaded(self.decode)
        place = self.deployment.place(journey.prompt_tokens, self._prefill_in_flight)
        if place is PrefillPlace.LOCAL:
            decode.add_prompt(now, journey, lambda at: None)
        else:
            self._decode_of[journey.request_id] = decode
            decode.reserve(now, journey, lambda at: self._send_to_prefill(journey, at))

    def _refused(self, journey: Journey) -> bool:
        """Whether the router's SLO admission refuses the request on the current loads (its
        prediction is kept on the journey either way)."""
        slo = self.deployment.admission
        if slo is None:
            return False
        self._take_back_idle()
        rate = self._arrivals.per_second(self.now)
        prediction = predict(
            journey.prompt_tokens, journey.output_tokens, self._states(), self._costs, rate
        )
        journey.predicted_ttft_s = prediction.ttft_s
        journey.refused = judge(prediction, slo) is not None
        return journey.refused

    def _states(self) -> list[WorkerState]:
        states = [self._state(w, WorkerRole.DECODE) for w in self.decode]
        return states + [self._state(w, WorkerRole.PREFILL) for w in self.prefill]

    def _arrive_adaptive(self, journey: Journey, now: float) -> None:
        """The router's cost-model choice over the workers' exact loads."""
        self._take_back_idle()
        by_name = {worker.name: worker for worker in self.prefill + self.decode}
        prompt, output = journey.prompt_tokens, journey.output_tokens
        rate = self._arrivals.per_second(now)
        option = place_adaptive(prompt, output, self._states(), self._costs, rate).option
        self._arrivals.record(now)
        decode = by_name[option.decode.address]
        if option.prefill is None:
            if decode in self.prefill:
                self._lent.add(decode.name)
            decode.add_prompt(now, journey, lambda at: None)
            return
        prefill = by_name[option.prefill.address]
        self._decode_of[journey.request_id] = decode
        decode.reserve(now, journey, lambda at: self._send_to_prefill(journey, at, prefill))

    def _state(self, worker: SimWorker, tier: WorkerRole) -> WorkerState:
        load = worker.engine_load()
        lent = worker.name in self._lent
        return WorkerState(
            address=worker.name,
            tier=tier,
            role=WorkerRole.DECODE if lent or tier is WorkerRole.DECODE else WorkerRole.PREFILL,
            running=load.num_running,
            context_tokens=load.num_context_tokens,
            pending_prompts=load.num_waiting,
            pending_prompt_tokens=load.num_pending_prompt_tokens,
            step_cap_s=load.step_cap_s,
        )

    def _take_back_idle(self) -> None:
        for worker in self.prefill:
            load = worker.engine_load()
            if worker.name in self._lent and not (load.num_running or load.num_waiting):
                self._lent.discard(worker.name)

    def _send_to_prefill(
        self, journey: Journey, now: float, prefill: SimWorker | None = None
    ) -> None:
        # The grant comes from inside the decode worker's loop turn; the Prefill call that follows
        # is a new event so the two workers' turns never nest.
        chosen = prefill or self._least_loaded(self.prefill)
        self._prefill_in_flight += 1
        self.at(now, lambda at: chosen.add_prompt(at, journey, lambda _: None, ships=True))

    def _prefilled(self, journey: Journey, now: float) -> None:
        decode = self._decode_of.pop(journey.request_id)
        num_blocks = blocks_for(journey.prompt_tokens, self.deployment.decode_config.block_size)
        sent = num_blocks - journey.num_cached_blocks  # decode's prefix cache held the rest
        landed = now + self.profile.blocks.delivery_s(sent)
        self.at(landed, lambda at: self._answered(decode, journey, at))

    def _answered(self, decode: SimWorker, journey: Journey, now: float) -> None:
        """Prefill's call returns once decode has the KV; the router then starts decode."""
        self._prefill_in_flight -= 1
        decode.kv_landed(now, journey)

    def _least_loaded(self, workers: list[SimWorker]) -> SimWorker:
        """worker_choice.py's least-loaded choice: the smallest load key, exact ties round robin."""
        keys = [worker.load() for worker in workers]
        best = min(keys)
        tied = [worker for worker, key in zip(workers, keys, strict=True) if key == best]
        return tied[next(self._turns) % len(tied)]
