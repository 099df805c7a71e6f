"""A cancel while the request is in prefill frees decode's reservation at once, even when the
router's first Decode.Abort times out (the RPC that carried it is gone; the abort still runs, and
the router tries again)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster

from ..integration.conftest import start_cluster
from ..integration.helpers import load, wait_all_blocks_free

pytestmark = pytest.mark.integration

# A first Abort try that always expires: on the old router it was the only one.
EXPIRING_ABORTS = ("--abort-timeout-seconds", "0.001")
# Tokens of each busy request: decode steps for seconds, past the cancel (which comes as soon
# as decode holds the long prompt's blocks) and the Abort's first, expiring try.
BUSY_TOKENS = 60


def test_cancel_in_prefill_frees_the_reservation(
    model_dir: Path, tmp_path: Path, prompts: list[list[int]], chaos_rounds: int
) -> None:
    cluster = start_cluster(model_dir, tmp_path / "logs", 1, 1, router_args=EXPIRING_ABORTS)
    long_prompt = (prompts[-1] * 4)[:1500]  # seconds of prefill on this CPU
    try:
        for _ in range(chaos_rounds):
            asyncio.run(_cancel_while_decode_is_busy(cluster, long_prompt, prompts[:4]))
            # Far below decode's 120 s reservation TTL, which was the only other way out.
            cancelled_at = time.monotonic()
            wait_all_blocks_free(cluster, timeout_s=5.0)
            print(f"chaos abort: every block free {time.monotonic() - cancelled_at:.2f} s after")
    finally:
        cluster.stop()


async def _cancel_while_decode_is_busy(
    cluster: Cluster, prompt: list[int], busy_prompts: list[list[int]]
) -> None:
    """Decode steps all along (other requests), so a command waits for the step in progress:
    long enough for a short-deadline Abort to expire before the engine thread gets to it."""
    async with GenerationClient.connect(cluster.router.address) as client:
        busy = [
            asyncio.ensure_future(
                client.generate(
                    build_request(
                        p, sampling=SamplingParams(max_tokens=BUSY_TOKENS, ignore_eos=True)
                    )
                )
            )
            for p in busy_prompts
        ]
        sampling = SamplingParams(max_tokens=8, temperature=0.0)
        call = asyncio.ensure_future(client.generate(build_request(prompt, sampling=sampling)))
        await _until_reserved(cluster, len(prompt) // 16)
        call.cancel()  # decode holds the reservation; prefill is computing the prompt
        with pytest.raises(asyncio.CancelledError):
            await call
        for reply in await asyncio.gather(*busy):
            assert len(reply.token_ids) == BUSY_TOKENS


async def _until_reserved(cluster: Cluster, long_prompt_blocks: int) -> None:
    """Until decode holds the long prompt's blocks: reserved for its transfer (or, if the router
    saw the loaded prefill tier as unhealthy and placed it locally, being prefilled there)."""
    decode = cluster.decode[0]
    deadline = time.monotonic() + 60
    while True:
        reply = load(decode)
        if reply.num_total_blocks - reply.num_free_blocks >= long_prompt_blocks:
            return
        assert time.monotonic() < deadline, f"decode never took the long prompt: {reply}"
        await asyncio.sleep(0.02)
