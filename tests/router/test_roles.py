"""What the adaptive placement reads of each worker between two Load polls (placement/roles.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from pdserve.costmodel.profile import BlockCosts, CostModel, Profile
from pdserve.costmodel.step_budget import StepCosts
from pdserve.router.placement.adaptive import WorkerRole, WorkerState
from pdserve.router.placement.prefill_place import PlacementMode

COSTS = StepCosts(
    Profile(CostModel((0.05, 0.001, 0.0, 0.005, 0.0)), BlockCosts(1, 0, 0, 0, 1e30), 16), 2048
)
ADAPTIVE = {"placement_mode": PlacementMode.ADAPTIVE, "costs": COSTS}


def _decode_state(stack: Any) -> WorkerState:
    states = stack.dispatcher.roles.worker_states()
    return next(s for s in states if s.tier is WorkerRole.DECODE)


def test_a_local_prompt_sent_since_the_poll_counts_as_a_prompt_not_a_stream(
    router_stack: Any,
) -> None:
    async def body() -> None:
        async with router_stack(**ADAPTIVE) as stack:
            await stack.registry.poll()
            pool = stack.registry.decode
            worker = pool.workers[stack.tiers.decode_addresses[0]]
            pool.acquire(worker)  # a local request: a call on the decode worker ...
            worker.sent_prompts.decided("local", 300)  # ... whose prompt it computes itself
            worker.sent_prompts.call_started("local")
            local = _decode_state(stack)
            assert (local.running, local.pending_prompts) == (0, 1)
            assert local.pending_prompt_tokens == 300
            pool.acquire(worker)  # a remote request's stream: KV from the prefill tier
            remote = _decode_state(stack)
            assert (remote.running, remote.pending_prompts) == (1, 1)
            await stack.registry.poll()  # the report covers both from here on
            polled = _decode_state(stack)
            assert (polled.running, polled.pending_prompts) == (0, 0)  # the fake reports idle
            pool.release(worker)
            pool.release(worker)

    asyncio.run(body())


def test_a_prompt_whose_call_has_not_started_outlives_the_report(router_stack: Any) -> None:
    """A remote prompt is counted on its prefill worker at the decision, and its Prefill call
    starts only after decode's Reserve: a report answered in between does not know of it, and a
    report whose poll started after the call does."""

    async def body() -> None:
        async with router_stack(**ADAPTIVE) as stack:
            await stack.registry.poll()
            worker = stack.registry.prefill.workers[stack.tiers.prefill_addresses[0]]
            worker.sent_prompts.decided("remote", 3000)
            await stack.registry.poll()  # while decode's Reserve runs
            assert (worker.sent_prompts.count, worker.sent_prompts.tokens) == (1, 3000)
            worker.sent_prompts.call_started("remote")
            await stack.registry.poll()
            assert worker.sent_prompts.count == 0

    asyncio.run(body())
