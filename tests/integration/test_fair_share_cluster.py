"""Tenants share a worker by weight through real processes: the router stamps each request's
tenant (from its header, router `--tenants`) and weight on what it sends, and a worker under
`--policy fair` serves the least-served tenant first.

Router + 1 decode worker (colocated: it prefills too) with one sequence at a time, so the order
in which requests finish is the order the worker admitted them. Tenant a floods it; tenant b's
one request, sent once a's wait in the worker's queue, is admitted as soon as the running one
ends (under first come first served it would finish last). Outputs equal transformers' greedy
tokens and no block stays held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster

from .conftest import WORKER_ARGS, start_cluster
from .helpers import load, wait_all_blocks_free

pytestmark = pytest.mark.integration

TENANTS = "tenants:\n  a: {weight: 1}\n  b: {weight: 1}\n"


@pytest.fixture(scope="module")
def fair_cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("fair-cluster")
    tenants = folder / "tenants.yaml"
    tenants.write_text(TENANTS)
    cluster = start_cluster(
        model_dir,
        folder,
        0,
        1,
        router_args=("--tenants", str(tenants)),
        worker_args=(*WORKER_ARGS, "--policy", "fair", "--max-num-seqs", "1"),
    )
    yield cluster
    cluster.stop()


async def _finish_order(
    cluster: Cluster, flood: list[list[int]], late: list[int], max_tokens: int
) -> tuple[list[str], dict[str, list[int]]]:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    finished: list[str] = []
    outputs: dict[str, list[int]] = {}

    async def send(client: GenerationClient, name: str, tenant: str, prompt: list[int]) -> None:
        reply = await client.generate(
            build_request(prompt, sampling=sampling), metadata=(("x-pdserve-tenant", tenant),)
        )
        finished.append(name)
        outputs[name] = list(reply.token_ids)

    async with GenerationClient.connect(cluster.router.address) as client:
        tasks = [
            asyncio.create_task(send(client, f"a{i}", "a", prompt))
            for i, prompt in enumerate(flood)
        ]
        deadline = time.monotonic() + 30
        while load(cluster.decode[0]).num_waiting < len(flood) - 2:
            assert time.monotonic() < deadline, "a's requests never queued in the worker"
            await asyncio.sleep(0.02)
        tasks.append(asyncio.create_task(send(client, "b", "b", late)))
        await asyncio.gather(*tasks)
    return finished, outputs


def test_a_late_tenant_goes_ahead_of_a_flood_and_outputs_match_transformers(
    fair_cluster: Cluster, prompts: list[list[int]], hf_greedy: list[list[int]], max_new_tokens: int
) -> None:
    flood, late = prompts[:-1], prompts[-1]
    finished, outputs = asyncio.run(_finish_order(fair_cluster, flood, late, max_new_tokens))
    # At most the request running when b arrived and one admitted in that step finish first.
    assert finished.index("b") <= 2, finished
    assert [outputs[f"a{i}"] for i in range(len(flood))] == hf_greedy[:-1]
    assert outputs["b"] == hf_greedy[-1]
    wait_all_blocks_free(fair_cluster)
