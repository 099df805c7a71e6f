"""`--routing-policy prefix-hash`: router replicas that share nothing send a prefix to the same
worker. The ranking and its load bound (pure), and two routers over the same fake tiers."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from pdserve.client import build_request
from pdserve.router.admission import Admission
from pdserve.router.clock import Deadline, RequestClock
from pdserve.router.dispatch import Dispatcher
from pdserve.router.placement.prefix_hash import PrefixHash
from pdserve.router.placement.worker_choice import (
    PREFIX_BALANCE_SLACK,
    RoutingPolicy,
    WorkerLoad,
    rendezvous_choice,
    rendezvous_rank,
)
from pdserve.router.registry import Registry
from pdserve.v1 import common_pb2

IDLE = WorkerLoad(num_free_blocks=100, num_total_blocks=100)
ADDRESSES = [f"10.0.0.{i}:50071" for i in range(8)]


def _queued(count: int) -> WorkerLoad:
    return WorkerLoad(num_waiting=count, num_free_blocks=100, num_total_blocks=100)


def _prompt(head: int, tail: int) -> list[int]:
    return [head] * 64 + [tail] * 20  # four leading 16-token blocks, then a distinct tail


def test_the_key_is_the_leading_blocks_only() -> None:
    keys = PrefixHash(block_size=16, depth_blocks=4)
    assert keys.key(_prompt(1, 2)) == keys.key(_prompt(1, 3)) is not None
    assert keys.key(_prompt(1, 2)) != keys.key(_prompt(4, 2))
    assert keys.key([7] * 15) is None  # not one full block
    assert PrefixHash(16, 4).key(_prompt(1, 2)) == keys.key(_prompt(1, 9))  # another process


def test_every_ranking_agrees_and_a_leaving_worker_moves_only_its_keys() -> None:
    keys = [PrefixHash(16, 4).key(_prompt(head, 0)) for head in range(200)]
    first = {key: ADDRESSES[rendezvous_rank(key, ADDRESSES)[0]] for key in keys if key}
    assert len(set(first.values())) == len(ADDRESSES)  # spread over every worker
    fewer = [a for a in ADDRESSES if a != ADDRESSES[3]]
    for key, address in first.items():
        now = fewer[rendezvous_rank(key, fewer)[0]]
        assert now == address or address == ADDRESSES[3]


def test_an_overloaded_or_full_first_choice_spills_to_the_next_in_the_ranking() -> None:
    key = PrefixHash(16, 4).key(_prompt(5, 0))
    assert key is not None
    ranking = rendezvous_rank(key, ADDRESSES)
    first, second = ranking[0], ranking[1]
    loads = [IDLE] * len(ADDRESSES)
    assert rendezvous_choice(loads, ADDRESSES, key, turn=0) == first
    at_bound = list(loads)
    at_bound[first] = _queued(PREFIX_BALANCE_SLACK)
    assert rendezvous_choice(at_bound, ADDRESSES, key, turn=0) == first
    beyond = list(loads)
    beyond[first] = _queued(PREFIX_BALANCE_SLACK + 1)
    assert rendezvous_choice(beyond, ADDRESSES, key, turn=1) == second
    full = list(loads)
    full[first] = WorkerLoad(num_free_blocks=0, num_total_blocks=100)
    assert rendezvous_choice(full, ADDRESSES, key, turn=2) == second
    assert rendezvous_choice(loads, ADDRESSES, None, turn=3) == 3  # no key: round robin


def test_two_router_replicas_send_each_prefix_to_the_same_worker(router_stack: Any) -> None:
    """Two routers (each its own registry, dispatcher and history) over the same four decode
    and two prefill workers take turns with requests of six prefixes: each prefix's requests
    all reach one decode worker and one prefill worker, whichever router sent them."""

    async def body() -> None:
        policy = RoutingPolicy.PREFIX_HASH
        async with router_stack(num_prefill=2, num_decode=4, routing_policy=policy) as stack:
            config = stack.dispatcher.config
            other = Registry(config)
            await other.start()
            replicas = [stack.servicer.admission, Admission(Dispatcher(other, config), config)]
            replicas[1].validator = replicas[0].validator
            try:
                for turn in range(24):
                    head = turn % 6
                    await _generate(replicas[turn % 2], _prompt(100 + head, turn))
                    # Each replica's own count of what it sent since the last Load report
                    # resets as its poll comes (every --load-poll-interval-seconds).
                    await asyncio.gather(stack.registry.poll(), other.poll())
            finally:
                await replicas[1].dispatcher.wait_aborts()
                await other.close()
            decode_calls = [worker.reserves for worker in stack.tiers.decode]
            prefill_calls = [worker.calls for worker in stack.tiers.prefill]
            for tier_calls in (decode_calls, prefill_calls):
                where: dict[int, set[int]] = {}
                for index, calls in enumerate(tier_calls):
                    for call in calls:
                        where.setdefault(call.request.prompt_token_ids[0], set()).add(index)
                assert len(where) == 6
                assert all(len(workers) == 1 for workers in where.values()), where

    asyncio.run(body())


async def _generate(admission: Admission, prompt: list[int]) -> None:
    sampling = common_pb2.SamplingParams(max_tokens=2)
    async with admission.admitted(build_request(prompt, sampling=sampling)) as valid:
        deltas = admission.deltas(valid, Deadline(None), RequestClock())
        async with contextlib.aclosing(deltas):
            async for _ in deltas:
                pass
