"""Decode.Multiplex on the real stream servicer over a real engine (the default model, on its
engine thread, served by grpc.aio on 127.0.0.1): one message per engine step carries the new
tokens of every request of the stream; the tokens, text and usage equal those of each request's
own GenerateLocal stream; a start error and a cancel end their request only; nothing stays held.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.core.serving import multiplex
from pdserve.core.serving.engine_loop import EngineLoop
from pdserve.core.serving.multiplex import MAX_MESSAGE_BYTES, split_by_bytes
from pdserve.core.serving.server import ServiceHost
from pdserve.core.serving.stream_servicer import StreamServicer
from pdserve.core.serving.tier_runtime import TierRuntime
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc

NUM_REQUESTS = 8
MAX_TOKENS = 10
GREEDY = common_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> LLMEngine:
    return LLMEngine(model_dir, EngineConfig(num_kv_blocks=96))


def _local(request_id: str, prompt: list[int], sampling: Any = GREEDY) -> Any:
    return decode_pb2.GenerateLocalRequest(
        request=common_pb2.WorkRequest(
            request_id=request_id, prompt_token_ids=prompt, sampling=sampling
        )
    )


async def _serve(
    engine: LLMEngine, host: SimpleNamespace | None = None
) -> tuple[grpc.aio.Server, str, EngineLoop]:
    # Only `draining` and `drained` of the host are read by the Decode servicer; this one never
    # drains unless the test passes a host that does.
    host = SimpleNamespace(draining=False, drained=asyncio.Event()) if host is None else host
    runtime = TierRuntime(cast(ServiceHost, host))
    loop = EngineLoop(engine)
    loop.start()
    runtime.loop = loop
    server = grpc.aio.server()
    decode_pb2_grpc.add_DecodeServicer_to_server(StreamServicer(runtime), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}", loop


class Commands:
    """The router's side of the stream: commands written when the test says."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[decode_pb2.MultiplexCommand | None] = asyncio.Queue()

    async def __aiter__(self) -> AsyncIterator[decode_pb2.MultiplexCommand]:
        while (command := await self.queue.get()) is not None:
            yield command


@pytest.mark.parametrize("limit", [MAX_MESSAGE_BYTES, 64], ids=["1MiB", "64B"])
def test_one_message_per_step_carries_every_request_and_each_matches_its_own_stream(
    engine: LLMEngine, prompts: list[list[int]], limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a 64-byte message limit every step goes out in many messages: each request's
    deltas still arrive whole and in order."""
    monkeypatch.setattr(multiplex, "MAX_MESSAGE_BYTES", limit)

    async def body() -> None:
        server, target, loop = await _serve(engine)
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = decode_pb2_grpc.DecodeStub(channel)
                alone = {}
                for index in range(NUM_REQUESTS):  # each on its own stream, one at a time
                    call = stub.GenerateLocal(_local(f"alone-{index}", prompts[index % 4]))
                    alone[index] = [d async for d in call]
                commands = Commands()
                for index in range(NUM_REQUESTS):
                    local = _local(f"mux-{index}", prompts[index % 4])
                    commands.queue.put_nowait(decode_pb2.MultiplexCommand(generate_local=local))
                unknown = decode_pb2.DecodeRequest(request_id="nobody", transfer_token=b"x")
                commands.queue.put_nowait(decode_pb2.MultiplexCommand(generate=unknown))
                steps: list[decode_pb2.DecodeStep] = []
                finished = 0
                call = stub.Multiplex(commands.__aiter__())
                async for step in call:
                    steps.append(step)
                    finished += sum(1 for d in step.deltas if d.finish_reason or d.error_code)
                    if finished == NUM_REQUESTS + 1:
                        break
                call.cancel()
        finally:
            await server.stop(None)
            loop.stop()
        deltas = [delta for step in steps for delta in step.deltas]
        failed = [d for d in deltas if d.error_code]
        # A Generate here (an LLMEngine, not a decode worker's): the code its own call answers,
        # on that request alone.
        assert [(d.request_id, d.error_code) for d in failed] == [
            ("nobody", grpc.StatusCode.FAILED_PRECONDITION.value[0])
        ]
        if limit < MAX_MESSAGE_BYTES:
            assert all(s.ByteSize() <= limit or len(s.deltas) == 1 for s in steps)
        else:
            # A step of the batch is one message holding all eight requests' tokens: about one
            # message per step, not one per request per token (80).
            full = [s for s in steps if len({d.request_id for d in s.deltas}) == NUM_REQUESTS]
            assert full
            assert len(steps) <= MAX_TOKENS + NUM_REQUESTS + 1  # (+1: the error's own message)
        for index in range(NUM_REQUESTS):
            mine = [d for d in deltas if d.request_id == f"mux-{index}"]
            own = alone[index]
            assert [t for d in mine for t in d.token_ids] == [t for d in own for t in d.token_ids]
            assert "".join(d.text for d in mine) == "".join(d.text for d in own)
            assert mine[-1].usage == own[-1].usage
            assert mine[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        pool = engine.scheduler.kv_manager.block_pool
        assert pool.num_free == pool.num_blocks and not engine.requests

    asyncio.run(body())


def test_a_cancel_and_the_end_of_the_stream_abort_their_requests(
    engine: LLMEngine, prompts: list[list[int]]
) -> None:
    async def body() -> None:
        server, target, loop = await _serve(engine)
        long = common_pb2.SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = decode_pb2_grpc.DecodeStub(channel)
                commands = Commands()
                for name in ("cancelled", "abandoned"):
                    local = _local(name, prompts[2], long)
                    commands.queue.put_nowait(decode_pb2.MultiplexCommand(generate_local=local))
                call = stub.Multiplex(commands.__aiter__())
                seen: set[str] = set()
                async for step in call:
                    seen.update(d.request_id for d in step.deltas)
                    if seen == {"cancelled", "abandoned"}:
                        break
                commands.queue.put_nowait(decode_pb2.MultiplexCommand(cancel="cancelled"))
                for _ in range(200):  # the cancel is applied between two steps
                    await asyncio.sleep(0.01)
                    if "cancelled" not in engine.requests:
                        break
                assert "cancelled" not in engine.requests and "abandoned" in engine.requests
                call.cancel()  # the router went away: what it ran here is aborted
                for _ in range(200):
                    await asyncio.sleep(0.01)
                    if not engine.requests and not loop.busy():
                        break
        finally:
            await server.stop(None)
            loop.stop()
        pool = engine.scheduler.kv_manager.block_pool
        assert not engine.requests and pool.num_free == pool.num_blocks

    asyncio.run(body())


def test_a_drained_worker_ends_the_stream_with_ok_once_its_requests_are_done(
    engine: LLMEngine, prompts: list[list[int]]
) -> None:
    """The router's stream outlives its requests; at the end of a drain the worker ends it with
    OK (it was cancelled by the server's stop, which grpc logs as an error), but not before the
    requests still running on it have finished."""

    async def body() -> None:
        host = SimpleNamespace(draining=False, drained=asyncio.Event())
        server, target, loop = await _serve(engine, host)
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = decode_pb2_grpc.DecodeStub(channel)
                commands = Commands()
                local = _local("running", prompts[1])
                commands.queue.put_nowait(decode_pb2.MultiplexCommand(generate_local=local))
                call = stub.Multiplex(commands.__aiter__())
                deltas: list[decode_pb2.TokenDelta] = []

                async def read_to_the_end() -> None:
                    async for step in call:
                        deltas.extend(step.deltas)
                        host.drained.set()  # while "running" runs: it still gets every token

                await asyncio.wait_for(read_to_the_end(), timeout=60)  # without the end: hangs
                assert await call.code() == grpc.StatusCode.OK
        finally:
            await server.stop(None)
            loop.stop()
        assert sum(len(d.token_ids) for d in deltas) == MAX_TOKENS
        assert deltas[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH

    asyncio.run(body())


def _delta(request_id: str, text: str) -> decode_pb2.TokenDelta:
    return decode_pb2.TokenDelta(request_id=request_id, token_ids=[1, 2], text=text)


def test_a_step_larger_than_the_limit_goes_out_in_messages_within_it() -> None:
    """600 deltas of 3,000 characters each (1.8 MB): messages of at most 1 MiB, every delta in
    its order; a delta larger than the limit alone goes alone."""
    step = decode_pb2.DecodeStep(deltas=[_delta(f"r{i % 7}", "x" * 3000) for i in range(600)])
    messages = list(split_by_bytes(step, MAX_MESSAGE_BYTES))
    assert len(messages) == 2
    assert all(message.ByteSize() <= MAX_MESSAGE_BYTES for message in messages)
    assert [d for m in messages for d in m.deltas] == list(step.deltas)
    huge = decode_pb2.DecodeStep(deltas=[_delta("a", "y" * 200), _delta("b", "z")])
    assert [len(m.deltas) for m in split_by_bytes(huge, 100)] == [1, 1]
    assert list(split_by_bytes(decode_pb2.DecodeStep(), 100)) == []
    small = decode_pb2.DecodeStep(deltas=[_delta("a", "hi")])
    assert list(split_by_bytes(small, 100)) == [small]
