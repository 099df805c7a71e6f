"""Regressions of the block sharing in the scheduler (prefix cache, copy-on-write forks)."""

from __future__ import annotations

from pdserve.core.config import EngineConfig
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.scheduler import Scheduler


def test_a_request_whose_kv_arrived_keeps_its_blocks() -> None:
    """Decode queues a request with the blocks prefill filled and num_computed_tokens = prompt
    length; admission must not swap them for a cached prefix (found by the integration test:
    the blocks leaked and the prompt was recomputed)."""
    scheduler = Scheduler(EngineConfig(block_size=4, num_kv_blocks=8))
    request = Request("r", list(range(9)), SamplingParams(max_tokens=4), 0, 0.0)
    blocks = scheduler.kv_manager.block_pool.allocate(3)
    assert blocks is not None
    request.block_ids, request.num_computed_tokens = list(blocks), 9
    request.output_token_ids.append(5)  # the first token, sampled by prefill
    scheduler.add(request)
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"r": 1}
    assert request.block_ids == blocks and request.num_computed_tokens == 9
    assert scheduler.kv_manager.num_prefix_query_tokens == 0


def test_a_swapped_request_that_cannot_fit_does_not_block_arrived_kv() -> None:
    """Decode under a small pool: the swapped head needs more blocks than are free, and the
    free ones will only come from requests whose KV arrived, waiting behind it. With nothing
    running, the head-of-line rule would wait forever (found by test_kv_sharing_cluster)."""
    scheduler = Scheduler(EngineConfig(block_size=4, num_kv_blocks=6, num_swap_blocks=4))
    head = Request("head", list(range(16)), SamplingParams(max_tokens=4), 0, 0.0)
    head.status, head.num_computed_tokens = RequestStatus.SWAPPED, 16
    head.swap_block_ids = scheduler.kv_manager.swap_pool.allocate(4) or []
    head.output_token_ids.append(5)
    scheduler.swapped.append(head)
    arrived = Request("arrived", list(range(8)), SamplingParams(max_tokens=4), 1, 0.0)
    arrived.block_ids = scheduler.kv_manager.block_pool.allocate(2) or []
    arrived.num_computed_tokens = 8
    arrived.output_token_ids.append(5)
    scheduler.add(arrived)
    assert scheduler.schedule().num_scheduled_tokens == {"arrived": 1}
    scheduler.record_computed(arrived, 1)
    scheduler.finish(arrived, RequestStatus.FINISHED_LENGTH)
    assert scheduler.schedule().num_scheduled_tokens == {"head": 1}  # five blocks free now


def test_forks_share_full_blocks_and_copy_the_partial_one() -> None:
    """A 10-token prompt in 4-token blocks, n = 3: the leader computes 9 tokens (blocks 0-2, the
    last one partly filled), the forks share all three; each sample's write into block 2 copies
    it, except the last holder's, which writes in place."""
    scheduler = Scheduler(EngineConfig(block_size=4, num_kv_blocks=16))
    params = SamplingParams(max_tokens=2, n=3)
    samples = [Request(f"r/{i}", list(range(10)), params.for_sample(i), 0, 0.0) for i in range(3)]
    leader = samples[0]
    leader.forks = samples[1:]
    scheduler.add(leader)
    assert scheduler.schedule().num_scheduled_tokens == {"r/0": 9}
    scheduler.record_computed(leader, 9)
    assert [s.block_ids for s in samples] == [leader.block_ids] * 3
    pool = scheduler.kv_manager.block_pool
    assert [pool.ref_count(b) for b in leader.block_ids] == [3, 3, 3]
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"r/0": 1, "r/1": 1, "r/2": 1}
    partial = samples[2].block_ids[2]
    assert len(output.copies) == 2 and all(src == partial for src, _ in output.copies)
    assert {s.block_ids[2] for s in samples} == {partial, *(dst for _, dst in output.copies)}
    assert [pool.ref_count(b) for b in leader.block_ids[:2]] == [3, 3]
    assert pool.num_used == 3 + 2
