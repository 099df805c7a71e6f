"""Decode's reservation queue over the real scheduler and KV-cache manager (no model): the order
it grants in, the cached prefixes it takes, and the blocks it gives back."""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.core.config import EngineConfig
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.reservation_queue import ReservationQueue
from pdserve.core.sched.scheduler import Scheduler

BLOCK = 4


@dataclass
class Entry:
    request: Request


def _queue(num_kv_blocks: int) -> tuple[Scheduler, ReservationQueue[Entry]]:
    scheduler = Scheduler(EngineConfig(block_size=BLOCK, num_kv_blocks=num_kv_blocks))
    return scheduler, ReservationQueue[Entry](scheduler)


def _reserve(queue: ReservationQueue[Entry], request_id: str, prompt: list[int]) -> Entry:
    entry = Entry(Request(request_id, prompt, SamplingParams(max_tokens=4), len(queue), 0.0))
    queue.append(entry)
    return entry


def _grant(queue: ReservationQueue[Entry]) -> list[str]:
    """Grants what the queue allows, every grant standing: the request ids granted."""
    granted: list[str] = []

    def post(entry: Entry) -> bool:
        granted.append(entry.request.request_id)
        return True

    queue.grant(post)
    return granted


def test_grants_in_order_until_one_does_not_fit() -> None:
    scheduler, queue = _queue(num_kv_blocks=6)
    _reserve(queue, "a", list(range(8)))  # 2 blocks
    _reserve(queue, "b", list(range(100, 116)))  # 4 blocks: the last ones
    _reserve(queue, "c", list(range(200, 204)))  # 1 block: none left
    assert _grant(queue) == ["a", "b"]
    assert [entry.request.request_id for entry in queue] == ["c"]
    assert scheduler.kv_manager.block_pool.num_free == 0


def test_a_head_that_does_not_fit_holds_smaller_ones_behind_it() -> None:
    scheduler, queue = _queue(num_kv_blocks=3)
    _reserve(queue, "big", list(range(16)))  # 4 blocks: not now
    _reserve(queue, "small", list(range(100, 104)))  # 1 block: would fit
    assert _grant(queue) == []
    assert len(queue) == 2
    assert scheduler.kv_manager.block_pool.num_free == 3  # the head took nothing


def test_requests_waiting_to_rejoin_the_batch_go_first() -> None:
    scheduler, queue = _queue(num_kv_blocks=8)
    recompute = Request("recompute", [1] * 8, SamplingParams(max_tokens=4), 0, 0.0)
    scheduler.add(recompute)  # waits in the scheduler's own queue
    _reserve(queue, "new", [2] * 4)
    assert _grant(queue) == []
    scheduler.schedule()  # the batch takes it back
    assert _grant(queue) == ["new"]


def test_a_landed_prompt_is_cached_for_later_reservations_and_counted() -> None:
    scheduler, queue = _queue(num_kv_blocks=16)
    kv_manager = scheduler.kv_manager
    prompt = list(range(10))  # two full blocks and a partial one
    first = _reserve(queue, "first", prompt)
    assert _grant(queue) == ["first"]
    assert first.request.status is RequestStatus.WAITING_FOR_KV
    queue.kv_landed(first.request)
    assert first.request.num_computed_tokens == 10
    second = _reserve(queue, "second", [*prompt, 99])
    assert _grant(queue) == ["second"]
    assert second.request.block_ids[:2] == first.request.block_ids[:2]  # by reference
    assert second.request.num_computed_tokens == 2 * BLOCK
    assert kv_manager.num_reused_blocks == 2
    assert (kv_manager.num_prefix_query_tokens, kv_manager.num_prefix_hit_tokens) == (10 + 11, 8)


def test_a_refused_grant_gives_its_blocks_back_uncounted() -> None:
    scheduler, queue = _queue(num_kv_blocks=4)
    kv_manager = scheduler.kv_manager
    refused = _reserve(queue, "refused", list(range(8)))
    queue.grant(lambda entry: False)  # e.g. the KV receive could not be posted
    assert len(queue) == 0 and not refused.request.block_ids
    assert refused.request.num_computed_tokens == 0
    assert kv_manager.block_pool.num_free == 4
    assert kv_manager.num_prefix_query_tokens == 0
