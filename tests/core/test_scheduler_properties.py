"""Property tests of the schedulers: random traffic on small pools, invariants after every step.

The simulator (sim.py) runs each plan against fake KV memory, so a swap that moves the wrong
blocks, a block given to two requests or a recompute that reads stale KV fails the step it happens
in. Around it these tests check the bookkeeping (queues, pools, budgets), the preemption order, that
every request finishes exactly once with the right number of tokens, and that the run ends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pdserve.core.config import EngineConfig, SchedulingPolicy
from pdserve.core.kv.block_pool import BlockPool, blocks_for
from pdserve.core.kv.sliding_window import NULL_BLOCK, first_visible_position, live_blocks
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import sample_ids
from pdserve.core.sched.scheduler import Scheduler
from pdserve.core.sched.static_scheduler import StaticScheduler
from tests.core.sim import Arrival, Simulation, StepRecord

# About 10 s for both property tests on one core; every example is a whole simulated run.
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw: st.DrawFn, block_sizes: tuple[int, ...]) -> EngineConfig:
    return EngineConfig(
        block_size=draw(st.sampled_from(block_sizes)),
        num_kv_blocks=draw(st.integers(2, 12)),
        num_swap_blocks=draw(st.sampled_from([0, 0, 1, 3, 8, 32])),
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.sampled_from([1, 2, 5, 16, 64])),
        policy=draw(st.sampled_from(SchedulingPolicy)),
        enable_prefix_caching=draw(st.booleans()),
        sjf_aging_tokens=draw(st.sampled_from([1, 4, 16])),
    )


@st.composite
def arrival_lists(draw: st.DrawFn, config: EngineConfig, last_step: int) -> list[Arrival]:
    """Requests that each fit the pool alone (what RequestIntake.check_fits lets in)."""
    capacity = config.num_kv_blocks * config.block_size
    arrivals = []
    for _ in range(draw(st.integers(2, 8))):
        prompt_len = draw(st.integers(1, min(32, capacity - 1)))
        max_tokens = draw(st.integers(1, min(12, capacity - prompt_len)))
        arrivals.append(
            Arrival(
                step=draw(st.integers(0, last_step)),
                prompt_len=prompt_len,
                max_tokens=max_tokens,
                priority=draw(st.integers(0, 3)),
                stop_after=draw(st.none() | st.integers(1, max_tokens)),
                abort_after=draw(st.none() | st.none() | st.integers(0, 25)),
                shared_prefix=draw(st.sampled_from([0, 0, 3, 8, 40])),
                n=draw(st.sampled_from([1, 1, 1, 2, 3])) if config.max_num_seqs >= 3 else 1,
            )
        )
    return arrivals


def step_bound(arrivals: Iterable[Arrival]) -> int:
    """No livelock: the best-ranked running request always gains a token and is never preempted
    (it fits the pool alone), so every request's tokens are computed once for good."""
    arrivals = list(arrivals)
    work = sum(arrival.prompt_len + arrival.max_tokens + 1 for arrival in arrivals)
    return 2 * (max(arrival.step for arrival in arrivals) + work) + 10


def run_checked(sim: Simulation, static: bool = False) -> None:
    bound = step_bound(sim.arrivals)
    while sim.has_work():
        assert sim.step_index < bound, f"no end after {bound} steps: {queues(sim)}"
        record = sim.step()
        check_plan(sim, record, static)
        check_state(sim)
        if not static:  # the static baseline admits whole batches in arrival order
            check_no_priority_inversion(sim)
    check_drained(sim)
    label_paths(sim)


def queues(sim: Simulation) -> dict[str, list[str]]:
    scheduler = sim.scheduler
    return {
        name: [request.request_id for request in queue]
        for name, queue in (
            ("waiting", scheduler.waiting),
            ("running", scheduler.running),
            ("swapped", scheduler.swapped),
        )
    }


def rank(sim: Simulation, request: Request) -> tuple[int, int, int]:
    """Smaller runs first, as documented for each policy; the worst request is the max."""
    order = request.arrival_order
    if sim.config.policy is SchedulingPolicy.PRIORITY:
        return (-request.params.priority, order, request.sample_index)
    if sim.config.policy is SchedulingPolicy.SJF:
        left = request.num_tokens - request.num_computed_tokens
        left += request.params.max_tokens - len(request.output_token_ids)
        return (left + sim.config.sjf_aging_tokens * order, order, request.sample_index)
    return (0, order, request.sample_index)


def check_plan(sim: Simulation, record: StepRecord, static: bool) -> None:
    config, output = sim.config, record.output
    running_after = set(record.running_after)
    admitted = running_after - set(record.running_before)
    for chunk in record.chunks:
        assert chunk.request in running_after, f"{chunk.request.request_id} runs but not running"
        assert 1 <= chunk.num_new <= chunk.num_tokens + len(chunk.drafts) - chunk.start
        if chunk.drafts:
            assert chunk.completes, "drafts ride only with a request that catches up"
        if static and chunk.request in admitted:
            assert chunk.completes, "a static batch prefills whole prompts"
    total = sum(chunk.num_new for chunk in record.chunks)
    if static and admitted:
        assert not record.running_before, "static batch admitted a request while one runs"
    else:
        assert total <= config.max_num_batched_tokens, f"{total} tokens scheduled"
    scheduled = {chunk.request for chunk in record.chunks}
    preempted = [sim.all_requests[rid] for rid in output.preempted_ids]
    assert len(set(preempted)) == len(preempted)
    for request in preempted:
        assert request in record.running_before and request not in running_after
        assert request not in scheduled
    if preempted and running_after:
        best_preempted = min(rank(sim, request) for request in preempted)
        worst_kept = max(rank(sim, request) for request in running_after)
        assert worst_kept < best_preempted, "preempted a request better than one kept"


def check_state(sim: Simulation) -> None:
    scheduler, config, runner = sim.scheduler, sim.config, sim.runner
    expected = {
        RequestStatus.WAITING: scheduler.waiting,
        RequestStatus.RUNNING: scheduler.running,
        RequestStatus.SWAPPED: scheduler.swapped,
    }
    in_queues = [request for queue in expected.values() for request in queue]
    assert len(set(in_queues)) == len(in_queues), f"a request in two queues: {queues(sim)}"
    unforked = {fork for request in in_queues for fork in request.forks}
    assert all(not fork.block_ids and fork.status is RequestStatus.WAITING for fork in unforked)
    assert set(in_queues) | unforked == set(sim.requests.values()), f"lost: {queues(sim)}"
    for status, queue in expected.items():
        assert all(request.status is status for request in queue)
    assert len(scheduler.running) <= scheduler.num_seats() <= config.max_num_seqs
    for request in scheduler.waiting:
        assert not request.block_ids and not request.swap_block_ids, "a waiting request owns KV"
        assert request.num_computed_tokens == 0, "a recomputed request must start from 0"
    window = runner.sliding_window
    for request in scheduler.running:
        computed = request.num_computed_tokens
        assert not request.swap_block_ids
        assert len(request.block_ids) >= blocks_for(computed, config.block_size)
        # With a sliding window only what the next query can see is checked (and kept).
        first = first_visible_position(computed, window)
        runner.check_holds(runner.device, request, request.block_ids, computed, first=first)
    for request in scheduler.swapped:
        computed = request.num_computed_tokens
        assert not live_blocks(request.block_ids), "a swapped request holds device blocks"
        table = request.block_ids + request.swap_block_ids  # slid-out slots, then the moved
        assert len(table) >= blocks_for(computed, config.block_size)
        first = first_visible_position(computed, window)
        runner.check_holds(runner.swap, request, table, computed, first=first)
    for request in scheduler.running:
        held = live_blocks(request.block_ids)
        assert len(set(held)) == len(held), "a block twice in one table"
        assert request.block_ids[: len(request.block_ids) - len(held)] == [NULL_BLOCK] * (
            len(request.block_ids) - len(held)
        ), "only leading slots slide out"
    device_ids = [
        block for request in scheduler.running for block in live_blocks(request.block_ids)
    ]
    check_owned(scheduler.kv_manager.block_pool, device_ids)
    swap_ids = [block for request in scheduler.swapped for block in request.swap_block_ids]
    # Blocks read by this step's swap-ins stay owned until the next schedule() frees them.
    check_owned(
        scheduler.kv_manager.swap_pool, swap_ids + list(scheduler.kv_manager.swapped_in_blocks)
    )
    if not config.enable_prefix_caching and all(arrival.n == 1 for arrival in sim.arrivals):
        assert len(set(device_ids)) == len(device_ids), "blocks shared with nothing to share"


def check_no_priority_inversion(sim: Simulation) -> None:
    """A preempted request waits only for better ones: nothing worse than it runs meanwhile."""
    scheduler = sim.scheduler
    preempted = [r for r in scheduler.waiting + scheduler.swapped if r.num_preemptions]
    if preempted and scheduler.running:
        best_preempted = min(preempted, key=lambda request: rank(sim, request))
        worst_running = max(scheduler.running, key=lambda request: rank(sim, request))
        assert rank(sim, worst_running) < rank(sim, best_preempted), (
            f"request {worst_running.request_id} runs while better request "
            f"{best_preempted.request_id} waits preempted"
        )


def label_paths(sim: Simulation) -> None:
    """Statistics (pytest --hypothesis-show-statistics): which paths the examples reached."""
    scheduler = sim.scheduler
    reached = {
        "swap-out": scheduler.num_swaps_out > 0,
        "recompute": scheduler.num_preemptions > scheduler.num_swaps_out,
        "swap-in": any(record.output.swap_in for record in sim.steps),
        "abort": any(f.status is RequestStatus.FINISHED_ABORTED for f in sim.finished.values()),
        "prefix hit": scheduler.kv_manager.num_prefix_hit_tokens > 0,
        "eviction": scheduler.kv_manager.block_pool.num_evictions > 0,
        "copy-on-write": any(record.output.copies for record in sim.steps),
    }
    for path in (name for name, happened in reached.items() if happened):
        event(path)


def check_owned(pool: BlockPool, owned: list[int]) -> None:
    """Every block's ref count is the number of its owners: none is free while referenced and
    none is held by nobody (a leak)."""
    owners = Counter(owned)
    assert len(owners) == pool.num_used, f"{pool.num_used} used, {len(owners)} owned"
    for block in range(pool.num_blocks):
        assert pool.ref_count(block) == owners.get(block, 0), f"block {block}: {sorted(owned)}"


def check_drained(sim: Simulation) -> None:
    expected = {
        sample_id
        for order, arrival in enumerate(sim.arrivals)
        for sample_id in sample_ids(str(order), arrival.n)
    }
    assert set(sim.finished) == expected
    for request_id, finish in sim.finished.items():
        arrival = sim.arrivals[int(request_id.partition("/")[0])]
        if finish.status is RequestStatus.FINISHED_LENGTH:
            assert finish.num_output_tokens == arrival.max_tokens
        elif finish.status is RequestStatus.FINISHED_STOPPED:
            assert finish.num_output_tokens == arrival.stop_after
        else:
            assert finish.status is RequestStatus.FINISHED_ABORTED
            assert finish.num_output_tokens < min(arrival.max_tokens, arrival.stop_after or 1 << 30)
    scheduler = sim.scheduler
    assert not scheduler.has_unfinished()
    pools = scheduler.kv_manager
    assert pools.block_pool.num_free == pools.block_pool.num_blocks
    last = scheduler.schedule()  # swap blocks read by the last swap-in are freed a step late
    assert last.is_empty and not last.swap_in and not last.swap_out
    assert pools.swap_pool.num_free == pools.swap_pool.num_blocks


@st.composite
def scenarios(
    draw: st.DrawFn, block_sizes: tuple[int, ...] = (1, 2, 3, 4, 8), last_step: int = 8
) -> tuple[EngineConfig, list[Arrival]]:
    config = draw(configs(block_sizes))
    return config, draw(arrival_lists(config, last_step))


@SETTINGS
@given(scenarios())
def test_continuous_scheduler_invariants(scenario: tuple[EngineConfig, list[Arrival]]) -> None:
    config, arrivals = scenario
    run_checked(Simulation(config, arrivals, Scheduler))


@SETTINGS
@given(scenarios(block_sizes=(1, 2), last_step=2))  # whole batches at once: decodes run out
def test_static_scheduler_invariants(scenario: tuple[EngineConfig, list[Arrival]]) -> None:
    config, arrivals = scenario
    run_checked(Simulation(config, arrivals, StaticScheduler), static=True)
