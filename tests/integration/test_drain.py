"""SIGTERM on a worker: it refuses new work, finishes what it has in flight (a decode stream, a
prefill tier's prompts), then exits cleanly; a draining decode worker's reservations whose
prompts still wait in the prefill queue move to another decode worker instead of holding it."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster, Process
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc

from .conftest import WORKER_ARGS, start_cluster
from .helpers import greedy_outputs, labelled_metric, load, wait_all_blocks_free

pytestmark = pytest.mark.integration


# One prompt at a time on each prefill worker, 32 tokens a step: a queue of seconds, so that a
# decode worker drains while prompts reserved on it still wait there.
SLOW_PREFILL = ("--max-num-seqs", "1", "--max-num-batched-tokens", "32")


@pytest.fixture(scope="module")
def two_prefill_two_decode(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One cluster for the three drains, in file order: a prefill worker's (the other serves
    on), a decode worker's with prompts queued for it (the other takes them), then the last
    decode worker's stream. No prefix cache: the prompts repeat, and each must be prefilled
    whole. A grace its prompts fit in on a busy 2-core host (5 s did not, with other clusters
    running): each worker must exit once idle, well before it. The router learns of a drain at
    its next Load poll; a decode worker's whole prefill queue takes 1-2 s on the current engine,
    so the default 0.5 s poll could find every prompt reserved on it already started (0
    redirects, seen in suite runs)."""
    cluster = start_cluster(
        model_dir,
        tmp_path_factory.mktemp("drain-logs"),
        num_prefill=2,
        num_decode=2,
        worker_args=(*WORKER_ARGS, "--no-prefix-cache"),
        prefill_args=SLOW_PREFILL,
        drain_grace_seconds=60.0,
        router_args=("--load-poll-interval-seconds", "0.1"),
    )
    yield cluster
    cluster.stop()


def _serving(processes: list[Process]) -> list[Process]:
    """The processes of a tier that have not exited (an earlier drain's has)."""
    return [process for process in processes if process.popen.poll() is None]


async def _reserve_status(address: str) -> grpc.StatusCode:
    request = decode_pb2.ReserveRequest(
        request=common_pb2.WorkRequest(
            request_id="during-drain",
            prompt_token_ids=[1, 2, 3],
            sampling=common_pb2.SamplingParams(),
        )
    )
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await decode_pb2_grpc.DecodeStub(channel).Reserve(request, timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


PREFILL_REQUESTS = 4  # two per prefill worker: one waits while the other runs (SLOW_PREFILL)
PREFILL_MAX_TOKENS = 8


def test_a_draining_prefill_worker_finishes_its_prefills(
    two_prefill_two_decode: Cluster, prompts: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """A prefill worker gets SIGTERM while prompts wait or run on it: every request still ends
    with transformers' greedy output, and the worker exits 0 once idle, not at the grace's
    end."""
    cluster = two_prefill_two_decode
    leaving, _ = _serving(cluster.prefill)
    indices = [4 + i % 4 for i in range(PREFILL_REQUESTS)]  # 63..500 tokens
    work = [prompts[index] for index in indices]
    expected = [hf_greedy[index][:PREFILL_MAX_TOKENS] for index in indices]
    # It finished its prompts: the grace did not cut them.
    _drains_with_outputs(cluster, work, expected, leaving, _has_prompts)


def _drains_with_outputs(
    cluster: Cluster,
    work: list[list[int]],
    expected: list[list[int]],
    process: Process,
    ready: Callable[[Process], bool],
) -> None:
    """`work`'s greedy outputs through a SIGTERM of `process` are `expected`; the process exits
    0 once idle, before its grace ran out."""
    max_tokens = len(expected[0])
    assert asyncio.run(_through_a_sigterm(cluster, work, max_tokens, process, ready)) == expected
    assert process.popen.wait(timeout=30) == 0
    assert cluster.log_dir is not None
    log = (cluster.log_dir / f"{process.role}-{process.index}.log").read_text()
    assert "(idle: True)" in log


async def _through_a_sigterm(
    cluster: Cluster,
    work: list[list[int]],
    max_tokens: int,
    process: Process,
    ready: Callable[[Process], bool],
) -> list[list[int]]:
    """Greedy outputs of `work` sent at once, `process` given SIGTERM once `ready(process)`."""
    outputs = asyncio.ensure_future(greedy_outputs(cluster, work, max_tokens))
    while not await asyncio.to_thread(ready, process):
        assert not outputs.done(), f"{process.role}-{process.index}: never {ready.__name__}"
        await asyncio.sleep(0.005)
    process.popen.send_signal(signal.SIGTERM)
    return await outputs


def _has_prompts(process: Process) -> bool:
    reply = load(process)
    return bool(reply.num_waiting or reply.num_running)


def _has_reservations(process: Process) -> bool:
    """Four or more waiting for their KV (decode counts reservations as waiting). The prefill
    queue is first come, first served: with two, both could be its first prompts, whose KV had
    begun to leave by the router's next Load poll (0 redirects, seen in CI); the fourth waits
    behind at least three prompts, more than a poll's time of prefill steps."""
    return load(process).num_waiting >= 4


QUEUED_REQUESTS = 12
MAX_TOKENS = 4


def test_prompts_queued_for_a_draining_decode_worker_follow_their_reservations(
    two_prefill_two_decode: Cluster, prompts: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """A decode worker gets SIGTERM while prompts reserved on it still wait in the prefill
    queue: the router reserves them on the other decode worker and redirects their prefills
    there (Prefill.Redirect). Every request ends with transformers' greedy output, the leaving
    worker exits 0 once idle, and no block stays held. Before, it waited for those prompts
    until its grace ran out, and a queue longer than the grace lost them."""
    cluster = two_prefill_two_decode
    leaving, _ = _serving(cluster.decode)
    indices = [4 + i % 4 for i in range(QUEUED_REQUESTS)]  # 63..500 tokens
    work = [prompts[index] for index in indices]
    expected = [hf_greedy[index][:MAX_TOKENS] for index in indices]
    _drains_with_outputs(cluster, work, expected, leaving, _has_reservations)
    # Both sides count it: the router's redirects, and the prefill engines' (they took them).
    name = "pdserve_{}_redirects_total"
    redirected = [
        labelled_metric(cluster.router, name.format("router"), outcome="redirected"),
        sum(
            labelled_metric(process, name.format("prefill"), outcome="redirected")
            for process in _serving(cluster.prefill)
        ),
    ]
    assert min(redirected) >= 1, (redirected, _router_redirects(cluster))
    wait_all_blocks_free(cluster)


def test_a_draining_decode_worker_finishes_its_stream_and_refuses_new_work(
    two_prefill_two_decode: Cluster,
) -> None:
    """The decode worker running a stream gets SIGTERM mid-stream (after the drains above, the
    last one: no other to move the stream to): it finishes the stream, refuses a new
    reservation, and exits 0."""
    cluster = two_prefill_two_decode
    leaving: list[Process] = []

    async def stream_through_a_drain() -> tuple[int, grpc.StatusCode]:
        sampling = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
        received = 0
        refused = grpc.StatusCode.OK
        request = build_request("Hello", sampling=sampling)
        async with GenerationClient.connect(cluster.router.address) as client:
            async for chunk in client.generate_stream(request):
                received += len(chunk.token_ids)
                if received == 3:
                    leaving.extend(_streaming(cluster.decode))
                    leaving[0].popen.send_signal(signal.SIGTERM)
                    await asyncio.sleep(0.5)
                    refused = await _reserve_status(leaving[0].address)
        return received, refused

    received, refused = asyncio.run(stream_through_a_drain())
    assert received == 30  # the stream in flight was finished
    assert refused is grpc.StatusCode.UNAVAILABLE  # new work was not
    assert leaving[0].popen.wait(timeout=30) == 0


def _streaming(decode: list[Process]) -> list[Process]:
    return [process for process in _serving(decode) if load(process).num_running]


def _router_redirects(cluster: Cluster) -> dict[str, float]:
    """The router's redirects by outcome, and its warnings: why a prompt was not redirected
    (no other worker, or its KV had begun to leave), for a failure's message."""
    outcomes = ("redirected", "too_late", "no_other_worker")
    counts = {
        outcome: labelled_metric(cluster.router, "pdserve_router_redirects_total", outcome=outcome)
        for outcome in outcomes
    }
    assert cluster.log_dir is not None
    log = (cluster.log_dir / "router-0.log").read_text().splitlines()
    print("\n".join(line for line in log if "WARNING" in line)[-4000:])
    return counts
