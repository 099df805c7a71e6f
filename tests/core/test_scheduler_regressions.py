"""Regressions the scheduler property tests found, each as its smallest scenario (run through the
same simulator, tests/core/sim.py)."""

from __future__ import annotations

from pdserve.core.config import EngineConfig, SchedulingPolicy
from pdserve.core.request import RequestStatus
from pdserve.core.sched.scheduler import Scheduler
from pdserve.core.sched.static_scheduler import StaticScheduler
from tests.core.sim import Arrival, Simulation
from tests.core.test_scheduler_properties import queues


def test_admission_preemption_admits_nothing_worse_than_its_victim() -> None:
    """H (priority 1) needs one block and preempts A, the worst running request; A's freed blocks
    must not go to B, which ranks below A (same priority, later arrival) -- A would be recomputed
    while B runs. Found by test_continuous_scheduler_invariants."""
    config = EngineConfig(
        block_size=1, num_kv_blocks=5, num_swap_blocks=0, policy=SchedulingPolicy.PRIORITY
    )
    a, b, h = Arrival(0, 4, 2), Arrival(0, 2, 1), Arrival(1, 1, 1, priority=1)
    sim = Simulation(config, [a, b, h], Scheduler)
    sim.step()  # A prefills its 4 blocks; B (2 blocks) waits behind it
    record = sim.step()  # A's decode takes the last block, then H arrives and preempts A
    assert record.output.preempted_ids == ("0",)
    assert [request.request_id for request in record.running_after] == ["2"]


def test_static_scheduler_resumes_a_swapped_request() -> None:
    """B is swapped out when A's decode takes the last block; once A's batch is done, B must come
    back. Found by test_static_scheduler_invariants (B stayed in `swapped` for ever)."""
    config = EngineConfig(block_size=1, num_kv_blocks=4, num_swap_blocks=4, max_num_seqs=2)
    sim = Simulation(config, [Arrival(0, 2, 2), Arrival(0, 1, 3)], StaticScheduler)
    sim.step()
    sim.step()
    assert [request.request_id for request in sim.scheduler.swapped] == ["1"]
    assert "0" in sim.finished
    for _ in range(5):
        if sim.has_work():
            sim.step()
    assert "1" in sim.finished, f"B never came back: {queues(sim)}"
    assert sim.finished["1"].status is RequestStatus.FINISHED_LENGTH


def test_idle_scheduler_holds_no_swap_blocks() -> None:
    """B is swapped in for its last token and finishes that step; with nothing left to run the
    engine calls schedule() no more, so the swap block B was read from must be free already
    (EngineStats.num_free_swap_blocks, the drained check in test_greedy_matches_hf)."""
    config = EngineConfig(block_size=1, num_kv_blocks=4, num_swap_blocks=4, max_num_seqs=2)
    sim = Simulation(config, [Arrival(0, 2, 2), Arrival(0, 1, 2)], Scheduler)
    while sim.has_work():
        sim.step()
    assert any(record.output.swap_in for record in sim.steps)
    assert sim.scheduler.kv_manager.swap_pool.num_free == config.num_swap_blocks
