"""A decode worker leaves mid-stream: its requests move to another decode worker and every
stream goes on as if nothing happened, on gRPC and on HTTP: the same tokens (greedy and seeded
sampling), the same text (including what the worker that left held back for a stop string's
look-ahead), the same finish reason and usage as the undisturbed run; no block stays held.
Two streams are under a JSON schema: their grammars resume where the output left off, and their
tokens are transformers' under the same mask.

- SIGKILL: the worker is lost; the router re-prefills each stream elsewhere (prompt + streamed).
- SIGTERM: the worker drains; the router moves each stream live, its KV pushed over UCX to the
  last worker (no re-prefill), and the drained worker exits cleanly.

Both in one cluster of three decode workers, one after the other, against one undisturbed run."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams
from pdserve.core.sampling_params import SamplingParams as CoreSamplingParams
from pdserve.core.serving.sampling_proto import sampling_to_proto
from pdserve.local.cluster import Cluster, Process

from ..integration.conftest import start_cluster
from ..integration.helpers import labelled_metric, load
from ..structured_cases import CASES
from .streams import Stream, stream_grpc, stream_http

pytestmark = pytest.mark.integration

# Past the structured streams' own ends (29 and 36 tokens, tests/oracle.py's references): they
# end by themselves, the rest run to this.
MAX_TOKENS = 40
TOKENS_BEFORE_KILL = 6
# Never in the output: each worker holds back its length - 1 characters of text, which a lost
# worker never released.
NEVER = "@@ this never appears in the output @@"
GRPC_STREAMS = 6  # the rest go through the HTTP door
# The first streams are CASES[0] and CASES[1] under their schemas (one lands on each decode
# worker as the router spreads them); they end by themselves after the kill.
STRUCTURED = 2


def _sampling(index: int) -> SamplingParams:
    """The structured streams, then greedy for even streams, seeded sampling for odd ones; all
    hold text back, and the unconstrained ones run to MAX_TOKENS (no stream ends before the
    kill)."""
    if index < STRUCTURED:
        params = CoreSamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            stop=(NEVER,),
            structured_outputs=CASES[index][1],
        )
        return sampling_to_proto(params)
    if index % 2 == 0:
        return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, stop=[NEVER])
    return SamplingParams(
        max_tokens=MAX_TOKENS,
        temperature=0.9,
        top_p=0.95,
        seed=100 + index,
        ignore_eos=True,
        stop=[NEVER],
    )


# Who leaves, in turn, from one cluster of three decode workers (one cluster start and one
# undisturbed run for both): decode-0 is lost, then decode-1 drains while decode-2 serves.
DEPARTURES = ((signal.SIGKILL, "migrated"), (signal.SIGTERM, "live"))


def test_streams_survive_decode_workers_leaving(
    model_dir: Path,
    tmp_path: Path,
    prompts: list[list[int]],
    structured_prompts: list[list[int]],
    structured_reference: list[list[int]],
    chaos_rounds: int,
) -> None:
    work = structured_prompts[:STRUCTURED] + prompts[1:7]
    for round_ in range(chaos_rounds):
        cluster = start_cluster(model_dir, tmp_path / f"logs-{round_}", 1, len(DEPARTURES) + 1)
        try:
            undisturbed = asyncio.run(_streams(cluster, work, None))
            unconstrained = undisturbed[STRUCTURED:GRPC_STREAMS]
            assert all(len(s.token_ids) == MAX_TOKENS for s in unconstrained)
            for leaving, (how, outcome) in enumerate(DEPARTURES):
                before = _migrations(cluster)
                moved = asyncio.run(_streams(cluster, work, (cluster.decode[leaving], how)))
                assert moved == undisturbed
                structured = [s.token_ids for s in moved[:STRUCTURED]]
                assert structured == structured_reference[:STRUCTURED]
                worst_gap = max(_worst_gap(s) for s in moved)
                print(
                    f"chaos {outcome} round {round_}: worst gap across the move {worst_gap:.2f} s"
                )
                after = _migrations(cluster)
                assert after[outcome] > before[outcome]
                if how is signal.SIGTERM:  # every stream moved with its KV, none re-prefilled
                    assert after["migrated"] == before["migrated"]
                    assert cluster.decode[leaving].popen.wait(timeout=60) == 0
            _wait_free([*cluster.prefill, cluster.decode[-1]])
        finally:
            cluster.stop()


def _migrations(cluster: Cluster) -> dict[str, float]:
    """The router's migrations so far, by how the stream moved."""
    name = "pdserve_router_migrations_total"
    return {
        kind: labelled_metric(cluster.router, name, outcome=kind) for kind in ("migrated", "live")
    }


async def _streams(
    cluster: Cluster, prompts: list[list[int]], disturb: tuple[Process, signal.Signals] | None
) -> list[Stream]:
    """What every prompt's client saw; with `disturb` (a decode worker, a signal), the worker
    gets the signal once every stream has TOKENS_BEFORE_KILL chunks."""
    streams = [Stream() for _ in prompts]
    http_url = cluster.http_url + "/v1"
    async with GenerationClient.connect(cluster.router.address) as client:
        tasks = [
            asyncio.ensure_future(stream_grpc(client, prompts[i], _sampling(i), streams[i]))
            for i in range(GRPC_STREAMS)
        ]
        tasks += [
            asyncio.ensure_future(
                asyncio.to_thread(stream_http, http_url, prompts[i], _sampling(i), streams[i])
            )
            for i in range(GRPC_STREAMS, len(prompts))
        ]
        if disturb is not None:
            while min(len(s.chunk_times) for s in streams) < TOKENS_BEFORE_KILL:
                await asyncio.sleep(0.005)
            worker, how = disturb
            worker.popen.send_signal(how)
        await asyncio.gather(*tasks)
    return streams


def _worst_gap(stream: Stream) -> float:
    times = stream.chunk_times
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def _wait_free(survivors: list[Process], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        replies = [load(process) for process in survivors]
        if all(r.num_free_blocks == r.num_total_blocks and not r.num_running for r in replies):
            return
        assert time.monotonic() < deadline, f"blocks still held: {replies}"
        time.sleep(0.1)
