"""SIGKILL of a decode worker mid-stream: its requests move to the other decode worker and every
stream goes on with no repeated or missing token; greedy output equals the undisturbed run's."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.cluster import Cluster

from ..integration.conftest import start_cluster
from ..integration.helpers import labelled_metric, load

pytestmark = pytest.mark.integration

MAX_TOKENS = 48
TOKENS_BEFORE_KILL = 6


def test_streams_survive_a_killed_decode_worker(
    model_dir: Path, tmp_path: Path, prompts: list[list[int]], chaos_rounds: int
) -> None:
    work = prompts[1:7]
    for round_ in range(chaos_rounds):
        cluster = start_cluster(model_dir, tmp_path / f"logs-{round_}", 1, 2)
        try:
            undisturbed, _ = asyncio.run(_streams(cluster, work, kill_after=None))
            migrated, worst_gap = asyncio.run(
                _streams(cluster, work, kill_after=TOKENS_BEFORE_KILL)
            )
            assert migrated == undisturbed
            print(f"chaos migration round {round_}: worst gap across the kill {worst_gap:.2f} s")
            moved = labelled_metric(
                cluster.router, "pdserve_router_migrations_total", outcome="migrated"
            )
            assert moved >= 1
            _wait_survivors_free(cluster)
        finally:
            cluster.stop()


async def _streams(
    cluster: Cluster, prompts: list[list[int]], kill_after: int | None
) -> tuple[list[list[int]], float]:
    """Every prompt's streamed tokens and the longest gap between two chunks of one stream
    (the time to recover); with `kill_after`, decode-0 is SIGKILLed once every stream has that
    many tokens."""
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    received: list[list[int]] = [[] for _ in prompts]
    worst_gap = 0.0
    async with GenerationClient.connect(cluster.router.address) as client:

        async def consume(index: int) -> None:
            nonlocal worst_gap
            request = build_request(prompts[index], sampling=sampling)
            last = None
            async for chunk in client.generate_stream(request, timeout=300):
                now = time.monotonic()
                if last is not None:
                    worst_gap = max(worst_gap, now - last)
                last = now
                received[index].extend(chunk.token_ids)

        tasks = [asyncio.ensure_future(consume(i)) for i in range(len(prompts))]
        if kill_after is not None:
            while min(len(tokens) for tokens in received) < kill_after:
                await asyncio.sleep(0.005)
            cluster.decode[0].popen.kill()
        await asyncio.gather(*tasks)
    return received, worst_gap


def _wait_survivors_free(cluster: Cluster, timeout_s: float = 15.0) -> None:
    survivors = [*cluster.prefill, cluster.decode[1]]
    deadline = time.monotonic() + timeout_s
    while True:
        replies = [load(process) for process in survivors]
        if all(r.num_free_blocks == r.num_total_blocks and not r.num_running for r in replies):
            return
        assert time.monotonic() < deadline, f"blocks still held: {replies}"
        time.sleep(0.1)
