"""SIGTERM on a worker: it refuses new work, finishes the stream in flight, then exits cleanly."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc

from .conftest import start_cluster

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
        request_id="during-drain", prompt_token_ids=[1, 2, 3], sampling=common_pb2.SamplingParams()
    )
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await decode_pb2_grpc.DecodeStub(channel).Reserve(request, timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK
