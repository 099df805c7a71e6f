"""Cancels, short deadlines and an overload burst at once: every call ends with its tokens or a
clear status, nothing hangs, and afterwards no tier holds a block."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import grpc
import pytest

from pdserve.client import GenerateResponse, GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster
from pdserve.v1.common_pb2 import FinishReason

from ..integration.conftest import start_cluster
from ..integration.helpers import wait_all_blocks_free

pytestmark = pytest.mark.integration

CALLS = 40
MAX_QUEUE = 12  # below CALLS: the burst must be shed, not queued without bound
# What a call may end with besides its tokens: shed, cancelled by us, or out of time.
ALLOWED = {
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


def test_storm_of_cancels_deadlines_and_overload(
    model_dir: Path, tmp_path: Path, prompts: list[list[int]], chaos_rounds: int
) -> None:
    router_args = ("--max-queue", str(MAX_QUEUE))
    cluster = start_cluster(model_dir, tmp_path / "logs", 1, 1, router_args=router_args)
    try:
        for round_ in range(chaos_rounds):
            outcomes = asyncio.run(_storm(cluster, prompts, random.Random(round_)))
            counts = {code.name: outcomes.count(code) for code in set(outcomes)}
            print(f"chaos storm round {round_}: {CALLS} calls -> {counts}")
            assert set(outcomes) <= ALLOWED | {grpc.StatusCode.OK}, outcomes
            assert outcomes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) > 0  # the burst was shed
            assert outcomes.count(grpc.StatusCode.OK) > 0  # and the rest served
            wait_all_blocks_free(cluster)
    finally:
        cluster.stop()


async def _storm(
    cluster: Cluster, prompts: list[list[int]], rng: random.Random
) -> list[grpc.StatusCode]:
    async with GenerationClient.connect(cluster.router.address) as client:
        calls = [_one(client, rng.choice(prompts), rng) for _ in range(CALLS)]
        return await asyncio.wait_for(asyncio.gather(*calls), timeout=600)  # no hang


async def _one(client: GenerationClient, prompt: list[int], rng: random.Random) -> grpc.StatusCode:
    sampling = SamplingParams(max_tokens=rng.randint(4, 40), temperature=0.0)
    request = build_request(prompt, sampling=sampling)
    fate = rng.random()
    timeout = rng.uniform(0.2, 1.5) if fate < 0.3 else 300.0
    call = asyncio.ensure_future(client.generate(request, timeout=timeout))
    if 0.3 <= fate < 0.6:
        await asyncio.sleep(rng.uniform(0.0, 2.0))
        call.cancel()
    try:
        reply = await call
    except asyncio.CancelledError:
        return grpc.StatusCode.CANCELLED
    except grpc.aio.AioRpcError as error:
        return error.code()
    _assert_whole(reply, sampling)
    return grpc.StatusCode.OK


def _assert_whole(reply: GenerateResponse, sampling: SamplingParams) -> None:
    """An OK reply is a finished generation: all its tokens (length), or up to EOS (stop)."""
    if reply.finish_reason == FinishReason.FINISH_REASON_LENGTH:
        assert len(reply.token_ids) == sampling.max_tokens
    else:
        assert reply.finish_reason == FinishReason.FINISH_REASON_STOP, reply.finish_reason
        assert len(reply.token_ids) <= sampling.max_tokens
