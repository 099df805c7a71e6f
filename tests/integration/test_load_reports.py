"""A worker's Load counts a prompt from the moment its call arrives: a prompt sent while the
prefill worker runs one long step is in no engine queue until that step ends, and before
5e322c6 a Load answered meanwhile reported none of it (the router, its own count reset by that
report, then priced the worker as if the prompt were not there)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Process

from .conftest import start_cluster
from .helpers import load, wait_all_blocks_free

pytestmark = pytest.mark.integration

LONG_PROMPT = list(range(1000, 2200))  # 1,200 tokens: one step of seconds on a CPU worker
SHORT_PROMPT = list(range(4000, 4300))
ONE_STEP = ("--max-num-batched-tokens", str(len(LONG_PROMPT)))


async def _pending_seen_during_the_long_step(router: str, prefill: Process) -> int:
    """Sends the long prompt, then, once its step runs, the short one; the most prompt tokens
    the prefill worker's Load reported pending before that step ended."""
    sampling = SamplingParams(max_tokens=1, temperature=0.0)
    async with GenerationClient.connect(router) as client:
        first = asyncio.ensure_future(
            client.generate(build_request(LONG_PROMPT, sampling=sampling))
        )
        deadline = time.monotonic() + 60
        while (await asyncio.to_thread(load, prefill)).step_running_seconds == 0:
            assert time.monotonic() < deadline and not first.done(), "the long step never ran"
            await asyncio.sleep(0.005)
        second = asyncio.ensure_future(
            client.generate(build_request(SHORT_PROMPT, sampling=sampling))
        )
        most = 0
        while True:
            reply = await asyncio.to_thread(load, prefill)
            if reply.step_running_seconds == 0:
                break  # the long step ended
            most = max(most, reply.num_pending_prompt_tokens)
            await asyncio.sleep(0.005)
        await asyncio.gather(first, second)
    return most


def test_a_prompt_sent_during_a_long_step_is_in_the_next_load(
    model_dir: Path, tmp_path: Path
) -> None:
    cluster = start_cluster(model_dir, tmp_path / "logs", 1, 1, prefill_args=ONE_STEP)
    try:
        most = asyncio.run(
            _pending_seen_during_the_long_step(cluster.router.address, cluster.prefill[0])
        )
        # The long prompt's tokens are pending until its step ends; the short one's came with
        # its call, while that step still ran.
        assert most >= len(LONG_PROMPT) + len(SHORT_PROMPT), most
        wait_all_blocks_free(cluster)
    finally:
        cluster.stop()
