"""The simulated workers and the real engines make the same decisions on one trace.

Colocated: the real `LLMEngine` (real model, small cache so that chunking, preemption, swap and
recompute all happen) runs a trace of arrivals given as step numbers and records every plan its
scheduler makes. The simulator runs the same trace with a fixed step time of one second, each
arrival half a second before the step it joins, and records its worker's plans: they must be
equal, step for step (which requests run, how many tokens each, every swap-out and swap-in pair,
every preemption), with the prefix cache off and on, for distinct prompts and for prompts that
share prefixes; and both must have found the same prompt tokens in their prefix caches.

Disaggregated: a real prefill and decode engine pair (in-process transfer) and the simulated 1P1D
serve requests one after another, some sharing prefixes: decode's reservations take the same
cached blocks (so prefill sends the same blocks) and both tiers count the same prefix hits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.scheduler import Scheduler, SchedulerOutput
from pdserve.decode_service.engine import DecodeEngine
from pdserve.planner.sim_cluster import ClusterSim, Deployment, SimResult
from pdserve.planner.workload import TraceRequest
from pdserve.prefill_service.engine import PrefillEngine
from tests.core.test_cross_tier_prefix import Tiers
from tests.fakes.local_transfer import LocalKVReceiver, LocalKVSender, LocalTransferHub
from tests.planner.helpers import fixed_step_profile


class RecordingScheduler(Scheduler):
    def __init__(self, config: EngineConfig, sliding_window: int | None = None) -> None:
        super().__init__(config, sliding_window)
        self.outputs: list[SchedulerOutput] = []

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        self.outputs.append(output)
        return output


@dataclass(frozen=True)
class Arrival:
    step: int  # the engine step it joins before
    prompt_tokens: int
    output_tokens: int
    prefix_id: int | None = None
    prefix_tokens: int = 0

    def real_prompt(self, index: int) -> list[int]:
        """Token ids with the trace's sharing: the prefix group's tokens, then its own."""
        shared = [50 + self.prefix_id] * self.prefix_tokens if self.prefix_id is not None else []
        return shared + [100 + index] * (self.prompt_tokens - self.prefix_tokens)

    def simulated(self, arrival_s: float) -> TraceRequest:
        return TraceRequest(
            arrival_s, self.prompt_tokens, self.output_tokens, self.prefix_id, self.prefix_tokens
        )


@dataclass(frozen=True)
class Case:
    config: EngineConfig
    shared_prefixes: bool


# A swap pool of three blocks: some preemptions swap, others recompute (with the prefix cache on,
# they take their own blocks back from it).
CONFIG = EngineConfig(
    num_kv_blocks=13, num_swap_blocks=3, max_num_seqs=4, max_num_batched_tokens=48
)
CASES = {
    "no prefix cache": Case(replace(CONFIG, enable_prefix_caching=False), shared_prefixes=False),
    "distinct prompts": Case(CONFIG, shared_prefixes=False),
    "shared prefixes": Case(CONFIG, shared_prefixes=True),
}


def _trace(shared_prefixes: bool) -> list[Arrival]:
    rng = random.Random(3)
    arrivals = []
    for i in range(10):
        step, prompt, output = 2 * i + rng.randint(0, 1), rng.randint(10, 60), rng.randint(5, 30)
        if shared_prefixes:  # two groups; prefixes of one, one and a half, two and a half blocks
            prefix_id, prefix_tokens = rng.randrange(2), min(prompt, rng.choice((16, 24, 40)))
            arrivals.append(Arrival(step, prompt, output, prefix_id, prefix_tokens))
        else:
            arrivals.append(Arrival(step, prompt, output))
    return arrivals


def _real_run(model_dir: Path, case: Case) -> tuple[list[SchedulerOutput], LLMEngine]:
    engine = LLMEngine(model_dir, case.config, scheduler_class=RecordingScheduler)
    trace = _trace(case.shared_prefixes)
    step = 0
    while step <= trace[-1].step or engine.has_unfinished():
        for index, arrival in enumerate(trace):
            if arrival.step == step:
                params = SamplingParams(
                    max_tokens=arrival.output_tokens, temperature=0.0, ignore_eos=True
                )
                engine.add_request(arrival.real_prompt(index), params, request_id=str(index))
        if engine.has_unfinished():
            engine.step()
        step += 1
    scheduler = engine.scheduler
    assert isinstance(scheduler, RecordingScheduler)
    return [output for output in scheduler.outputs if not output.is_empty], engine


def _simulated_run(case: Case) -> tuple[list[SchedulerOutput], ClusterSim, SimResult]:
    trace = _trace(case.shared_prefixes)
    requests = [arrival.simulated(max(arrival.step - 0.5, 0.0)) for arrival in trace]
    sim = ClusterSim(Deployment(0, 1, decode_config=case.config), fixed_step_profile(1.0))
    worker = sim.decode[0]
    worker.record_outputs = True
    result = sim.run(requests)
    return worker.outputs, sim, result


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_simulated_scheduler_decides_like_the_real_engine(model_dir: Path, case: Case) -> None:
    simulated, sim, result = _simulated_run(case)
    scheduler = sim.decode[0].scheduler
    assert any(output.swap_out for output in simulated), "the trace must exercise swap"
    assert scheduler.num_preemptions > scheduler.num_swaps_out, "and recompute"
    if case.config.enable_prefix_caching:
        assert result.prefix_hit_tokens > 0, "and prefix-cache hits"
    real, engine = _real_run(model_dir, case)
    assert len(simulated) == len(real)
    for step, (sim_output, real_output) in enumerate(zip(simulated, real, strict=True)):
        assert sim_output == real_output, f"step {step} differs"
    stats = engine.stats()
    assert (result.prefix_query_tokens, result.prefix_hit_tokens) == (
        stats.num_prefix_query_tokens,
        stats.num_prefix_hit_tokens,
    )


# One after another (each done before the next arrives), so that every prefix cached so far is
# there to be found: (prompt tokens, prefix_id, prefix_tokens), 16-token blocks.
SEQUENTIAL = [
    (40, 0, 32),
    (50, 0, 32),  # group 0's two full blocks are cached on both tiers
    (20, 1, 20),
    (36, 1, 20),  # group 1's first block (its prefix's second is partly filled)
    (40, None, 0),
    (40, 0, 40),  # request 0's prompt up to its last token's block: two blocks
    (16, 1, 16),  # one block, the last prompt token's: it travels
]
EXPECTED_CACHED_BLOCKS = [0, 2, 0, 1, 0, 2, 0]


def _sequential() -> list[Arrival]:
    return [Arrival(0, prompt, 3, prefix_id, prefix) for prompt, prefix_id, prefix in SEQUENTIAL]


def test_simulated_decode_reserves_cached_prefixes_like_the_real_tier(model_dir: Path) -> None:
    config = EngineConfig(num_kv_blocks=96)
    hub = LocalTransferHub()
    tiers = Tiers(
        PrefillEngine(model_dir, config, LocalKVSender(hub)),
        DecodeEngine(model_dir, config, lambda cache: LocalKVReceiver(hub, cache, 4)),
    )
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    real_cached = []
    for index, arrival in enumerate(_sequential()):
        prompt, request_id = arrival.real_prompt(index), f"r{index}"
        destination = tiers.decode.reserve(request_id, prompt, greedy).result(timeout=0)
        outcome = tiers.prefill.submit(request_id, prompt, greedy, destination)
        while not outcome.done():
            tiers.prefill.step()
        tiers.finish(request_id, destination, outcome.result().first_token_id)
        real_cached.append(destination.num_cached_blocks)
    assert tiers.all_free()

    deployment = Deployment(1, 1, prefill_config=config, decode_config=config)
    sim = ClusterSim(deployment, fixed_step_profile(0.01))
    trace = [arrival.simulated(10.0 * index) for index, arrival in enumerate(_sequential())]
    result = sim.run(trace)
    assert [journey.num_cached_blocks for journey in result.journeys] == real_cached
    assert real_cached == EXPECTED_CACHED_BLOCKS
    for real_engine, simulated in ((tiers.prefill, sim.prefill[0]), (tiers.decode, sim.decode[0])):
        stats = real_engine.stats()
        assert (
            simulated.kv_manager.num_prefix_query_tokens,
            simulated.kv_manager.num_prefix_hit_tokens,
        ) == (stats.num_prefix_query_tokens, stats.num_prefix_hit_tokens)
    assert sim.decode[0].kv_manager.num_reused_blocks == sum(EXPECTED_CACHED_BLOCKS)
    assert tiers.decode.scheduler.kv_manager.num_reused_blocks == sum(EXPECTED_CACHED_BLOCKS)
