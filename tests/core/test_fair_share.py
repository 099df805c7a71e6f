"""The `fair` policy: tenants share a worker's steps by weight, whoever sends more requests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pdserve.core.config import EngineConfig, SchedulingPolicy
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.fair_share import TenantCounters
from tests.core.sim import Arrival, Simulation
from tests.core.test_greedy_matches_hf import assert_engine_empty


def _simulation(policy: SchedulingPolicy, arrivals: list[Arrival]) -> Simulation:
    config = EngineConfig(block_size=4, num_kv_blocks=256, max_num_seqs=3, policy=policy)
    return Simulation(config, arrivals)


def _tokens_by_tenant(sim: Simulation, steps: range) -> Counter[str]:
    """Tokens each tenant had computed in `steps` of the run (it runs until they are done)."""
    served: Counter[str] = Counter()
    while sim.has_work():
        record = sim.step()
        if sim.step_index - 1 in steps:
            for chunk in record.chunks:
                served[chunk.request.params.tenant] += chunk.num_new
    return served


def _burst(tenant: str, count: int, step: int = 0, weight: float = 1.0) -> list[Arrival]:
    return [Arrival(step, 4, 8, tenant=tenant, tenant_weight=weight) for _ in range(count)]


def test_tenants_share_the_steps_by_weight_however_many_requests_come_first() -> None:
    """Tenant a's 30 requests all arrive before b's 30: first come first served gives a the
    whole of the first steps; `fair` gives them tokens 2:1 by weight while both have work."""
    arrivals = _burst("a", 30, weight=2.0) + _burst("b", 30)
    fair = _tokens_by_tenant(_simulation(SchedulingPolicy.FAIR, arrivals), range(60))
    assert 1.6 <= fair["a"] / fair["b"] <= 2.5, fair
    fcfs = _tokens_by_tenant(_simulation(SchedulingPolicy.FCFS, arrivals), range(60))
    assert fcfs["b"] == 0, fcfs


def test_a_tenant_arriving_late_is_served_before_a_flood_queued_earlier() -> None:
    """b's two requests arrive at step 5 while most of a's twenty still queue: the next two
    seats that free are b's, under first come first served the last two."""

    def started_after_arrival(policy: SchedulingPolicy) -> list[str]:
        sim = _simulation(policy, _burst("a", 20) + _burst("b", 2, step=5))
        started: dict[str, str] = {}  # request id -> tenant, in the order they first ran
        while sim.has_work():
            for chunk in sim.step().chunks:
                if sim.step_index > 5:
                    started.setdefault(chunk.request.request_id, chunk.request.params.tenant)
                else:
                    started.setdefault(chunk.request.request_id, "")
        return [tenant for tenant in started.values() if tenant]

    assert started_after_arrival(SchedulingPolicy.FAIR)[:2] == ["b", "b"]
    assert started_after_arrival(SchedulingPolicy.FCFS)[-2:] == ["b", "b"]


def test_idle_time_banks_no_credit() -> None:
    """a works alone for 100 steps; b then floods. b starts level with a, not 100 steps behind:
    a keeps about half the tokens from then on instead of being starved until b catches up."""
    arrivals = _burst("a", 60) + _burst("b", 60, step=40)
    served = _tokens_by_tenant(_simulation(SchedulingPolicy.FAIR, arrivals), range(40, 80))
    assert served["a"] >= 0.35 * (served["a"] + served["b"]), served


def test_counters_forget_idle_tenants_at_or_below_the_floor() -> None:
    counters = TenantCounters()
    counters.join("a", [])
    counters.join("b", ["a"])
    counters._served.update({"a": 10.0, "b": 4.0, "gone": 1.0, "ahead": 20.0})
    counters.join("c", ["a", "b"])
    assert counters.served("c") == 4.0
    assert "gone" not in counters._served  # lifted to 4 if it came back: nothing to keep
    assert counters.served("ahead") == 20.0  # keeps what it was served past the floor
    counters.join("d", [])
    assert counters.served("a") == 0.0  # nobody had work: every counter starts over


def test_fair_greedy_equals_transformers(
    model_dir: Path, prompts: list[list[int]], hf_greedy: list[list[int]], max_new_tokens: int
) -> None:
    llm = LLM(model_dir, policy="fair", max_num_seqs=3, num_kv_blocks=64)
    params = [
        SamplingParams(max_tokens=max_new_tokens, temperature=0, tenant=f"t{i % 2}")
        for i in range(len(prompts))
    ]
    outputs = llm.generate(prompts, params)
    assert [list(out.outputs[0].token_ids) for out in outputs] == hf_greedy
    assert_engine_empty(llm)
