"""A discrete-event simulation of the router and its prefill and decode workers.

The router does what `router/dispatch.py` does, with its least-loaded choice (`router/policy.py`)
made on exact loads instead of polled ones: pick a decode worker, Reserve the prompt's blocks
there; once granted, pick a prefill worker and send it the prompt; when prefill finishes, its KV
crosses to decode (wire + scatter from the profile) and decode admits the request at its next loop
turn, which is when the client sees the first token. In colocated mode (no prefill workers) and,
with a disaggregation threshold, for prompts shorter than it, the prompt goes straight to a decode
worker and is prefilled there in chunks inside its continuous batch. That choice is made by the
router's own rule (`router/placement.py` `place_prefill`), including `--max-prefill-queue`.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pdserve.core.config import EngineConfig
from pdserve.core.scheduler import Scheduler, blocks_for
from pdserve.planner.profile import Profile
from pdserve.planner.sim_worker import Journey, Role, SimWorker, UsageSample
from pdserve.planner.workload import TraceRequest
from pdserve.router.placement import PrefillPlace, PrefillTierState, place_prefill


@dataclass(frozen=True)
class Deployment:
    num_prefill: int
    num_decode: int
    prefill_config: EngineConfig = field(default_factory=EngineConfig)
    decode_config: EngineConfig = field(default_factory=EngineConfig)
    disagg_threshold: int = 0  # prompts shorter than this are prefilled on decode; 0: none are
    # Prefill calls in flight per prefill worker at which long prompts go to decode too; 0: never.
    max_prefill_queue: int = 0
    # Fraction of the profiled device each worker of a tier gets: 0.5 for two workers pinned to
    # one core (both busy, each at half speed), as the 2-core validation runs are.
    prefill_share: float = 1.0
    decode_share: float = 1.0

    def __post_init__(self) -> None:
        if self.num_prefill < 0:
            raise ValueError(f"prefill: must be >= 0, got {self.num_prefill}")
        if self.num_decode < 1:
            raise ValueError(f"decode: must be >= 1, got {self.num_decode}")
        for name in ("disagg_threshold", "max_prefill_queue"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")

    @property
    def name(self) -> str:
        threshold = (
            f" T{self.disagg_threshold}" if self.disagg_threshold and self.num_prefill else ""
        )
        return f"{self.num_prefill}P{self.num_decode}D{threshold}"

    def placement(self, prompt_tokens: int, prefill_in_flight: int) -> PrefillPlace:
        tier = PrefillTierState(self.num_prefill, prefill_in_flight)
        return place_prefill(
            prompt_tokens, self.disagg_threshold, self.max_prefill_queue, tier
        ).place


@dataclass(frozen=True)
class SimResult:
    journeys: tuple[Journey, ...]
    usage: tuple[UsageSample, ...]
    num_steps: int
    num_preemptions: int
    end_s: float  # when the last event happened


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
        self.prefill = [
            SimWorker(f"prefill-{i}", Role.PREFILL, deployment.prefill_config, profile, self.at,
                      scheduler_class, deployment.prefill_share)
            for i in range(deployment.num_prefill)
        ]  # fmt: skip
        self.decode = [
            SimWorker(f"decode-{i}", Role.DECODE, deployment.decode_config, profile, self.at,
                      scheduler_class, deployment.decode_share)
            for i in range(deployment.num_decode)
        ]  # fmt: skip
        for worker in self.prefill:
            worker.on_prefilled = self._prefilled
        self._decode_of: dict[str, SimWorker] = {}
        self._prefill_in_flight = 0  # Prefill calls sent and not answered (the router's count)
        self._turns = itertools.count()

    def at(self, time: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._events, (time, next(self._order), action))

    def run(self, requests: Sequence[TraceRequest]) -> SimResult:
        journeys = [
            Journey(index, r.arrival_s, r.prompt_tokens, r.output_tokens)
            for index, r in enumerate(sorted(requests, key=lambda r: r.arrival_s))
        ]
        for journey in journeys:
            self.at(journey.arrival_s, functools.partial(self._arrive, journey))
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
        )

    def _arrive(self, journey: Journey, now: float) -> None:
        decode = self._least_loaded(self.decode)
        place = self.deployment.placement(journey.prompt_tokens, self._prefill_in_flight)
        if place is PrefillPlace.LOCAL:
            decode.add_prompt(now, journey, lambda at: None)
        else:
            self._decode_of[journey.request_id] = decode
            decode.reserve(now, journey, lambda at: self._send_to_prefill(journey, at))

    def _send_to_prefill(self, journey: Journey, now: float) -> None:
        # The grant comes from inside the decode worker's loop turn; the Prefill call that follows
        # is a new event so the two workers' turns never nest.
        prefill = self._least_loaded(self.prefill)
        self._prefill_in_flight += 1
        self.at(now, lambda at: prefill.add_prompt(at, journey, lambda _: None))

    def _prefilled(self, journey: Journey, now: float) -> None:
        decode = self._decode_of.pop(journey.request_id)
        num_blocks = blocks_for(journey.prompt_tokens, self.deployment.decode_config.block_size)
        landed = now + self.profile.blocks.delivery_s(num_blocks)
        self.at(landed, lambda at: self._answered(decode, journey, at))

    def _answered(self, decode: SimWorker, journey: Journey, now: float) -> None:
        """Prefill's call returns once decode has the KV; the router then starts decode."""
        self._prefill_in_flight -= 1
        decode.kv_landed(now, journey)

    def _least_loaded(self, workers: list[SimWorker]) -> SimWorker:
        """router/policy.py's choice: the smallest load key, exact ties round robin."""
        keys = [worker.load() for worker in workers]
        best = min(keys)
        tied = [worker for worker, key in zip(workers, keys, strict=True) if key == best]
        return tied[next(self._turns) % len(tied)]
