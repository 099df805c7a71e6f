"""SIGTERM on a worker: it refuses new work, finishes what it has in flight (a decode stream, a
prefill tier's prompts), then exits cleanly."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Process
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc

from .conftest import start_cluster
from .helpers import greedy_outputs, load

pytestmark = pytest.mark.integration


def test_a_draining_decode_worker_finishes_its_stream_and_refuses_new_work(
    model_dir: Path, tmp_path: Path
) -> None:
    cluster = start_cluster(model_dir, tmp_path / "logs", num_prefill=1, num_decode=1)
    decode = cluster.decode[0]
    try:

        async def stream_through_a_drain() -> tuple[int, grpc.StatusCode]:
            sampling = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
            received = 0
            refused = grpc.StatusCode.OK
            request = build_request("Hello", sampling=sampling)
            async with GenerationClient.connect(cluster.router.address) as client:
                async for chunk in client.generate_stream(request):
                    received += len(chunk.token_ids)
                    if received == 3:
                        decode.popen.send_signal(signal.SIGTERM)
                        await asyncio.sleep(0.5)
                        refused = await _reserve_status(decode.address)
            return received, refused

        received, refused = asyncio.run(stream_through_a_drain())
        assert received == 30  # the stream in flight was finished
        assert refused is grpc.StatusCode.UNAVAILABLE  # new work was not
        assert decode.popen.wait(timeout=30) == 0
    finally:
        cluster.stop()


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


PREFILL_REQUESTS = 8  # four per prefill worker: some wait while one runs


def test_a_draining_prefill_worker_finishes_its_prefills(
    model_dir: Path, tmp_path: Path, prompts: list[list[int]]
) -> None:
    """prefill-0 gets SIGTERM while prompts wait or run on it: every request still ends with
    its undisturbed greedy output, and the worker exits 0 once idle, not at the grace's end."""
    logs = tmp_path / "logs"
    # A grace its prompts fit in on a busy 2-core host (5 s did not, with other clusters running):
    # the worker must exit once idle, well before it.
    cluster = start_cluster(model_dir, logs, num_prefill=2, num_decode=1, drain_grace_seconds=60.0)
    draining = cluster.prefill[0]
    work = [prompts[4 + i % 4][i:] for i in range(PREFILL_REQUESTS)]  # 63..500 tokens, distinct
    try:
        undisturbed = asyncio.run(greedy_outputs(cluster, work, max_tokens=8))

        async def through_a_drain() -> list[list[int]]:
            outputs = asyncio.ensure_future(greedy_outputs(cluster, work, max_tokens=8))
            while not await asyncio.to_thread(_has_prompts, draining) and not outputs.done():
                await asyncio.sleep(0.005)
            assert not outputs.done(), "prefill-0 never had a prompt in flight"
            draining.popen.send_signal(signal.SIGTERM)
            return await outputs

        assert asyncio.run(through_a_drain()) == undisturbed
        assert draining.popen.wait(timeout=30) == 0
        log = (logs / "prefill-0.log").read_text()
        assert "(idle: True)" in log  # it finished its prompts; the grace did not cut them
    finally:
        cluster.stop()


def _has_prompts(process: Process) -> bool:
    reply = load(process)
    return bool(reply.num_waiting or reply.num_running)
