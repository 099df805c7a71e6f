"""`--routing-policy prefix`: the scorer (pure), the router's map of recent prefixes, and the
router over fake tiers sending shared-prefix requests to one worker while others spread."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from pdserve.client import build_request
from pdserve.router.placement.prefix_map import PrefixMap
from pdserve.router.placement.worker_choice import (
    MIN_PREFIX_SHARE,
    PREFIX_BALANCE_SLACK,
    RoutingPolicy,
    WorkerLoad,
    prefix_choice,
)
from pdserve.v1 import common_pb2

IDLE = WorkerLoad(num_free_blocks=100, num_total_blocks=100)


def _queued(count: int) -> WorkerLoad:
    return WorkerLoad(num_waiting=count, num_free_blocks=100, num_total_blocks=100)


def test_the_longest_match_wins_over_a_lighter_load() -> None:
    loads = [IDLE, _queued(2), IDLE]
    assert prefix_choice(loads, [3, 8, 0], num_blocks=10, turn=0) == 1


def test_no_match_or_a_short_one_is_least_loaded() -> None:
    loads = [_queued(1), IDLE]
    assert prefix_choice(loads, [0, 0], num_blocks=10, turn=0) == 1
    short = int(MIN_PREFIX_SHARE * 40) - 1  # a shared header, not a shared prompt
    assert prefix_choice(loads, [short, 0], num_blocks=40, turn=0) == 1
    assert prefix_choice(loads, [short + 1, 0], num_blocks=40, turn=0) == 0


def test_an_overloaded_or_full_holder_falls_back_to_least_loaded() -> None:
    at_bound = [_queued(PREFIX_BALANCE_SLACK), IDLE]
    assert prefix_choice(at_bound, [5, 0], num_blocks=5, turn=0) == 0
    beyond = [_queued(PREFIX_BALANCE_SLACK + 1), IDLE]
    assert prefix_choice(beyond, [5, 0], num_blocks=5, turn=0) == 1
    full = [WorkerLoad(num_free_blocks=0, num_total_blocks=100), IDLE]
    assert prefix_choice(full, [5, 0], num_blocks=5, turn=0) == 1


def test_equal_matches_go_to_the_least_loaded_holder_then_round_robin() -> None:
    assert prefix_choice([_queued(1), IDLE, IDLE], [4, 4, 0], num_blocks=4, turn=0) == 1
    picks = Counter(prefix_choice([IDLE, IDLE], [4, 4], num_blocks=4, turn=t) for t in range(4))
    assert picks == {0: 2, 1: 2}


def test_the_scorer_refuses_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="matched"):
        prefix_choice([IDLE, IDLE], [1], num_blocks=1, turn=0)


def test_the_map_matches_leading_blocks_only_and_stays_bounded() -> None:
    prefixes = PrefixMap(block_size=4, max_blocks=6)
    shared = list(range(100, 112))  # three blocks
    prefixes.record("a", prefixes.hashes([*shared, 1, 2, 3, 4]))
    assert prefixes.matched("a", prefixes.hashes([*shared, 9, 9, 9, 9])) == 3
    assert prefixes.matched("a", prefixes.hashes([0, *shared])) == 0  # same tokens, shifted
    assert prefixes.matched("b", prefixes.hashes(shared)) == 0
    prefixes.record("a", prefixes.hashes(list(range(200, 212))))  # 3 more: 7 > 6
    assert prefixes.num_blocks("a") == 6
    assert prefixes.matched("a", prefixes.hashes(shared)) == 3  # the oldest tail went first
    prefixes.forget("a")
    assert prefixes.matched("a", prefixes.hashes(shared)) == 0


def test_a_worker_that_keeps_more_blocks_is_remembered_with_more() -> None:
    """A worker with KV offload tiers reports how many prefix blocks it keeps (Load's
    num_cacheable_blocks): the map keeps that many of its own, never fewer than its default."""
    prefixes = PrefixMap(block_size=4, max_blocks=2)
    prefixes.set_capacity("offloading", 5)
    prefixes.set_capacity("small", 1)
    for worker in ("offloading", "small"):
        prefixes.record(worker, prefixes.hashes(list(range(100, 128))))  # seven blocks
    assert (prefixes.num_blocks("offloading"), prefixes.num_blocks("small")) == (5, 2)
    prefixes.forget("offloading")  # a new process behind the address: it reports afresh
    prefixes.record("offloading", prefixes.hashes(list(range(100, 128))))
    assert prefixes.num_blocks("offloading") == 2


def _prompt(head: int, tail: int) -> list[int]:
    return [head] * 64 + [tail] * 20  # four shared 16-token blocks, then a distinct tail


def test_the_router_keeps_a_shared_prefix_on_one_worker_and_spreads_the_rest(
    router_stack: Any,
) -> None:
    async def body() -> None:
        prefix = RoutingPolicy.PREFIX
        async with router_stack(num_prefill=2, num_decode=3, routing_policy=prefix) as stack:
            sampling = common_pb2.SamplingParams(max_tokens=2)
            prompts = [_prompt(7, tail) for tail in range(6)]
            prompts += [_prompt(head, 0) for head in range(8, 14)]
            for prompt in prompts:  # one after another, polled: every worker looks idle
                await stack.client.generate(build_request(prompt, sampling=sampling))
                await stack.registry.poll()
            shared = [
                [r for r in fake.reserves if r.request.prompt_token_ids[0] == 7]
                for fake in stack.tiers.decode
            ]
            assert sorted(map(len, shared)) == [0, 0, 6]
            others = [
                len(f.reserves) - len(mine)
                for f, mine in zip(stack.tiers.decode, shared, strict=True)
            ]
            assert sorted(others) == [2, 2, 2]  # round robin among idle workers
            # The prefill tier's choice is prefix-aware too: its cache saves the computation.
            prefilled = [
                [c for c in f.calls if c.request.prompt_token_ids[0] == 7]
                for f in stack.tiers.prefill
            ]
            assert sorted(map(len, prefilled)) == [0, 6]

    asyncio.run(body())


def test_least_loaded_spreads_the_shared_prefix(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_decode=3) as stack:
            sampling = common_pb2.SamplingParams(max_tokens=2)
            for tail in range(6):
                await stack.client.generate(build_request(_prompt(7, tail), sampling=sampling))
            assert sorted(len(fake.reserves) for fake in stack.tiers.decode) == [2, 2, 2]

    asyncio.run(body())
