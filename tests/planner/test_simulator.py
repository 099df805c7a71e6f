"""The simulator on cases with known answers: one request through each mode, M/D/1 queueing, and
the step counts of static and continuous batching over the bench workloads."""

from __future__ import annotations

import heapq
import random

import pytest

from pdserve.bench.offline.workload import WORKLOAD_DIR, load_workload
from pdserve.core.config import EngineConfig
from pdserve.core.sched.scheduler import Scheduler
from pdserve.core.sched.static_scheduler import StaticScheduler
from pdserve.planner.sim_cluster import ClusterSim, Deployment, SimResult
from pdserve.planner.sim_report import summarize
from pdserve.planner.workload import TraceRequest
from pdserve.router.placement.prefill_place import PlacementConfig, PlacementMode
from tests.planner.helpers import fixed_step_profile

STEP = 0.05


def _run(deployment: Deployment, requests: list[TraceRequest], **profile: float) -> SimResult:
    return ClusterSim(deployment, fixed_step_profile(STEP, **profile)).run(requests)


@pytest.mark.parametrize("deployment", [Deployment(0, 1), Deployment(1, 1), Deployment(2, 3)])
def test_one_request_takes_one_step_per_token(deployment: Deployment) -> None:
    """Colocated: the prompt's step samples token 1. Disaggregated: prefill samples it, the KV
    lands at once, decode admits it then. Either way token k comes at k steps."""
    journey = _run(deployment, [TraceRequest(1.0, 40, 5)]).journeys[0]
    assert journey.token_times == pytest.approx([1.0 + STEP * k for k in range(1, 6)])


def test_kv_delivery_delays_the_first_token_and_nothing_after() -> None:
    per_block = 0.01
    result = _run(Deployment(1, 1), [TraceRequest(0.0, 40, 3)], delivery_s_per_block=per_block)
    journey = result.journeys[0]
    delivery = 3 * per_block  # 40 tokens = 3 blocks of 16
    assert journey.token_times == pytest.approx(
        [STEP + delivery, 2 * STEP + delivery, 3 * STEP + delivery]
    )


def test_one_worker_one_slot_is_an_md1_queue() -> None:
    """One request per step (max_num_seqs 1, one output token): M/D/1 with service STEP, whose
    mean wait is rho * STEP / (2 (1 - rho)) (Pollaczek-Khinchine)."""
    rho = 0.6
    rng = random.Random(7)
    now, requests = 0.0, []
    for _ in range(40_000):
        now += rng.expovariate(rho / STEP)
        requests.append(TraceRequest(now, 8, 1))
    config = EngineConfig(max_num_seqs=1)
    result = _run(Deployment(0, 1, decode_config=config), requests)
    expected = STEP + rho * STEP / (2 * (1 - rho))
    assert summarize(result)["ttft_mean"] == pytest.approx(expected, rel=0.03)


def test_a_request_arriving_mid_step_waits_for_the_step_to_end() -> None:
    result = _run(Deployment(0, 1), [TraceRequest(0.0, 8, 4), TraceRequest(0.02, 8, 1)])
    assert result.journeys[1].token_times == pytest.approx([2 * STEP])


def _static_steps(lengths: list[int], batch: int) -> int:
    """Whole batches in order: each runs as long as its longest request."""
    return sum(max(lengths[i : i + batch]) for i in range(0, len(lengths), batch))


def _continuous_steps(lengths: list[int], slots: int) -> int:
    """A request holds a slot for exactly its length in steps, from the step after a slot frees
    (list scheduling on `slots` machines)."""
    free_at = [0] * slots
    for length in lengths:
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + length)
    return max(free_at)


@pytest.mark.parametrize("workload", ["mixed.json", "uniform.json"])
@pytest.mark.parametrize("slots", [8, 64])
@pytest.mark.parametrize("scheduler", [Scheduler, StaticScheduler])
def test_bench_workload_step_counts(workload: str, slots: int, scheduler: type[Scheduler]) -> None:
    items = load_workload(WORKLOAD_DIR / workload)
    requests = [TraceRequest(0.0, len(item.prompt), item.max_tokens) for item in items]
    # A budget above every prompt's total, so joining requests never wait for budget.
    config = EngineConfig(max_num_seqs=slots, num_kv_blocks=4096, max_num_batched_tokens=8192)
    sim = ClusterSim(Deployment(0, 1, decode_config=config), fixed_step_profile(STEP), scheduler)
    result = sim.run(requests)
    lengths = [item.max_tokens for item in items]
    expected = (
        _static_steps(lengths, slots)
        if scheduler is StaticScheduler
        else _continuous_steps(lengths, slots)
    )
    assert result.num_steps == expected
    assert summarize(result)["completed"] == len(items)


def test_a_small_cache_preempts_and_every_request_still_finishes() -> None:
    requests = [TraceRequest(0.01 * i, 60, 80) for i in range(12)]
    config = EngineConfig(num_kv_blocks=24, num_swap_blocks=8, max_num_seqs=8)
    result = _run(Deployment(1, 1, decode_config=config), requests)
    assert result.num_preemptions > 0
    assert all(len(j.token_times) == j.output_tokens for j in result.journeys)


def test_threshold_sends_short_prompts_to_decode() -> None:
    """With a threshold, a short prompt skips the prefill tier (its first token comes from decode's
    own step) and a long one takes it (its KV delivery shows in its TTFT)."""
    per_block = 0.01
    deployment = Deployment(1, 1, placement=PlacementConfig(disagg_threshold=32))
    short, long = _run(
        deployment,
        [TraceRequest(0.0, 20, 1), TraceRequest(10.0, 40, 1)],
        delivery_s_per_block=per_block,
    ).journeys
    assert short.token_times == pytest.approx([STEP])
    assert long.token_times == pytest.approx([10.0 + STEP + 3 * per_block])


def test_a_saturated_prefill_tier_sends_long_prompts_to_decode() -> None:
    """The router's rule: with one prefill call in flight per worker allowed, a long prompt that
    arrives while one is in flight is prefilled on decode."""
    per_block = 0.01
    deployment = Deployment(1, 1, placement=PlacementConfig(8, max_prefill_queue=1))
    first, second = _run(
        deployment,
        [TraceRequest(0.0, 40, 1), TraceRequest(0.001, 40, 1)],
        delivery_s_per_block=per_block,
    ).journeys
    assert first.token_times == pytest.approx([STEP + 3 * per_block])  # through prefill
    assert second.token_times == pytest.approx([0.001 + STEP])  # on decode


@pytest.mark.parametrize("deployment", [Deployment(0, 1), Deployment(1, 1), Deployment(2, 2)])
def test_distinct_prompts_never_hit_the_prefix_cache(deployment: Deployment) -> None:
    """Every simulated prompt has tokens of its own: equal lengths, equal arrival times and a
    cache that never evicts find nothing to reuse, on either tier."""
    requests = [TraceRequest(0.1 * (i // 4), 64, 4) for i in range(16)]
    result = _run(deployment, requests)
    expected_queries = 64 * 16 * (2 if deployment.num_prefill else 1)  # prefill and decode look
    assert (result.prefix_query_tokens, result.prefix_hit_tokens) == (expected_queries, 0)


def test_a_shared_prefix_hits_on_both_tiers_and_skips_the_wire() -> None:
    """Five requests one after another sharing a 40-token prefix (two full blocks and a half):
    from the second on, prefill finds two blocks cached and so does decode's reservation, whose
    blocks then do not travel (3 + 1 blocks of 16 tokens for 50 tokens: one crosses, not four)."""
    per_block = 0.01
    requests = [TraceRequest(float(i), 50, 2, prefix_id=7, prefix_tokens=40) for i in range(5)]
    result = _run(Deployment(1, 1), requests, delivery_s_per_block=per_block)
    assert [j.num_cached_blocks for j in result.journeys] == [0, 2, 2, 2, 2]
    assert result.prefix_query_tokens == 2 * 5 * 50
    assert result.prefix_hit_tokens == 2 * 4 * 32
    first, *later = result.journeys
    assert first.token_times[0] == pytest.approx(STEP + 4 * per_block)
    for journey in later:
        assert journey.token_times[0] - journey.arrival_s == pytest.approx(STEP + 2 * per_block)


def test_requests_share_only_the_prefix_the_trace_gives_them() -> None:
    """Same prefix id, different lengths: they share the shorter prefix; another id shares
    nothing. Colocated, one after another: each hit is the cached blocks of the shared part."""
    requests = [
        TraceRequest(0.0, 60, 1, prefix_id=1, prefix_tokens=48),
        TraceRequest(1.0, 60, 1, prefix_id=1, prefix_tokens=20),  # one block of the 48
        TraceRequest(2.0, 60, 1, prefix_id=2, prefix_tokens=48),  # another prefix: none
        TraceRequest(3.0, 60, 1, prefix_id=1, prefix_tokens=48),  # request 0's three blocks
    ]
    result = _run(Deployment(0, 1), requests)
    assert result.prefix_hit_tokens == 16 + 0 + 48


def test_adaptive_placement_is_the_routers_own_function() -> None:
    """One placement module: the simulator calls the router's decision, not a copy."""
    from pdserve.planner import sim_cluster
    from pdserve.router.placement import adaptive

    assert sim_cluster.place_adaptive is adaptive.place_adaptive


def test_adaptive_placement_lends_an_idle_prefill_worker_streams() -> None:
    """Two requests at once on 1P1D: the first stays on the decode worker (no hand-off); the
    second would stall it, so it runs end to end on the idle prefill worker, and both decode in
    parallel: every token of each comes one step apart from the start."""
    adaptive = PlacementConfig(mode=PlacementMode.ADAPTIVE)
    result = _run(Deployment(1, 1, placement=adaptive), [TraceRequest(0.0, 20, 3)] * 2)
    for journey in result.journeys:
        assert journey.token_times == pytest.approx([STEP, 2 * STEP, 3 * STEP])
    usage = {sample.worker for sample in result.usage}
    assert usage == {"prefill-0", "decode-0"}


def test_an_itl_slo_caps_the_simulated_steps_too() -> None:
    """The simulated workers step under the same budget as real ones: with every step costing
    more than the SLO, a prompt beside a decode gets MIN_CHUNK_TOKENS a step."""
    from pdserve.costmodel.step_budget import MIN_CHUNK_TOKENS

    deployment = Deployment(0, 1, itl_slo_s=STEP / 2)
    assert max(_prompt_chunks_beside_a_stream(deployment)) == MIN_CHUNK_TOKENS


def test_the_mean_itl_mode_runs_on_the_simulated_clock() -> None:
    """Under --itl-slo-mode mean the simulated workers price a stream's gaps by simulated time:
    every step takes twice the SLO, so the stream is ever further behind and a prompt beside
    it still gets MIN_CHUNK_TOKENS a step (on a wall clock the gaps would look free)."""
    from pdserve.costmodel.step_budget import MIN_CHUNK_TOKENS, ItlMode

    deployment = Deployment(0, 1, itl_slo_s=STEP / 2, itl_slo_mode=ItlMode.MEAN)
    assert max(_prompt_chunks_beside_a_stream(deployment)) == MIN_CHUNK_TOKENS


def _prompt_chunks_beside_a_stream(deployment: Deployment) -> list[int]:
    """A 100-token prompt arriving while a stream decodes (every step costs STEP): its
    chunks in the steps that also decode the stream."""
    sim = ClusterSim(deployment, fixed_step_profile(STEP))
    for worker in sim.decode:
        worker.record_outputs = True
    sim.run([TraceRequest(0.0, 4, 10), TraceRequest(STEP / 2, 100, 1)])
    return [
        output.num_scheduled_tokens.get("1", 0)
        for output in sim.decode[0].outputs
        if "0" in output.num_scheduled_tokens
    ]


def test_streams_in_flight_hold_decode_and_are_not_scored() -> None:
    """A stream decoding from 0 with 4 tokens to go holds decode's only slot: a request arriving
    during its first step gets its first token only after the stream's last step (3 steps: its
    first token comes with its KV, as a remote prompt's does), and only it is in the result."""
    deployment = Deployment(0, 1, decode_config=EngineConfig(max_num_seqs=1))
    request = TraceRequest(STEP / 5, 40, 1)
    profile = fixed_step_profile(STEP)
    alone = ClusterSim(deployment, profile).run([request])
    behind = ClusterSim(deployment, profile).run([request], streams=[TraceRequest(0.0, 300, 4)])
    assert alone.journeys[0].token_times == pytest.approx([STEP / 5 + STEP])
    assert [journey.index for journey in behind.journeys] == [0]
    assert behind.journeys[0].token_times == pytest.approx([4 * STEP])
