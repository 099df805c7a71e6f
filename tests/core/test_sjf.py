"""Shortest-job-first: short jobs go first, aging bounds how long a long one waits."""

from __future__ import annotations

from pathlib import Path

from pdserve.core.config import EngineConfig, SchedulingPolicy
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.scheduler import Scheduler
from tests.core.sim import Arrival, Simulation
from tests.core.test_greedy_matches_hf import assert_engine_empty


def _start_order(policy: SchedulingPolicy, aging: int, arrivals: list[Arrival]) -> list[str]:
    """Request ids in the order they were first scheduled, one request at a time."""
    config = EngineConfig(
        block_size=4, num_kv_blocks=64, max_num_seqs=1, policy=policy, sjf_aging_tokens=aging
    )
    sim = Simulation(config, arrivals, Scheduler)
    order: list[str] = []
    while sim.has_work():
        for chunk in sim.step().chunks:
            if chunk.request.request_id not in order:
                order.append(chunk.request.request_id)
    return order


# One long job (8 prompt + 40 output tokens = 48 of work) ahead of 30 short ones (3 each).
BURST = [Arrival(0, 8, 40)] + [Arrival(0, 2, 1) for _ in range(30)]


def test_sjf_runs_short_jobs_first_but_ages_the_long_one_in() -> None:
    """Short job k (arrival k) ranks 3 + 4k against the long job's 48: jobs 1..11 overtake it,
    within the stated bound of W / sjf_aging_tokens = 12 later arrivals."""
    order = _start_order(SchedulingPolicy.SJF, 4, BURST)
    assert order.index("0") == 11
    assert order[:11] == [str(k) for k in range(1, 12)]


def test_fcfs_runs_the_long_job_first() -> None:
    assert _start_order(SchedulingPolicy.FCFS, 4, BURST)[0] == "0"


def test_sjf_greedy_equals_transformers(
    model_dir: Path, prompts: list[list[int]], hf_greedy: list[list[int]], max_new_tokens: int
) -> None:
    llm = LLM(model_dir, policy="sjf", max_num_seqs=3, num_kv_blocks=64)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_new_tokens, temperature=0))
    assert [list(out.outputs[0].token_ids) for out in outputs] == hf_greedy
    assert_engine_empty(llm)
