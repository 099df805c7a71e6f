"""Killing one prefill process while requests are queued: the router retries on the other."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request

from .conftest import start_cluster

pytestmark = pytest.mark.integration


def test_requests_survive_a_killed_prefill_worker(
    model_dir: Path,
    tmp_path: Path,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    cluster = start_cluster(model_dir, tmp_path / "logs", num_prefill=2, num_decode=1)
    try:

        async def run_while_killing() -> list[list[int]]:
            sampling = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
            async with GenerationClient.connect(cluster.router.address) as client:
                calls = [
                    asyncio.ensure_future(client.generate(build_request(p, sampling=sampling)))
                    for p in prompts
                ]
                await asyncio.sleep(0.5)  # requests are now queued on both prefill workers
                cluster.prefill[0].popen.kill()
                replies = await asyncio.gather(*calls)
            return [list(reply.token_ids) for reply in replies]

        assert asyncio.run(run_while_killing()) == hf_greedy
        assert cluster.prefill[0].popen.poll() is not None
    finally:
        cluster.stop()
