"""A fake `pdserve.v1.Generation` servicer on a real grpc.aio server on 127.0.0.1.

It runs in its own thread and event loop, so a test can drive it with asyncio.run() or through
the CLI exactly as against the router. Prompt "bad" is refused with INVALID_ARGUMENT; otherwise it
answers max_tokens tokens (default 4), one stream chunk per token, `token_delay_s` apart.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeAlias, TypeVar

import grpc
import pytest

from pdserve.v1 import common_pb2, generation_pb2, generation_pb2_grpc

_Reply = TypeVar("_Reply")

Context: TypeAlias = "grpc.aio.ServicerContext[generation_pb2.GenerateRequest, _Reply]"
REJECTED_PROMPT = "bad"
REJECTION = "prompt: rejected by the fake server"


# unused-ignore: the ignore is needed only while mypy cannot resolve pdserve.v1 (then Any).
class FakeGeneration(generation_pb2_grpc.GenerationServicer):  # type: ignore[misc, unused-ignore]
    def __init__(self, token_delay_s: float) -> None:
        self.token_delay_s = token_delay_s

    async def Generate(
        self,
        request: generation_pb2.GenerateRequest,
        context: Context[generation_pb2.GenerateResponse],
    ) -> generation_pb2.GenerateResponse:
        count = await self._admit(request, context)
        await asyncio.sleep(self.token_delay_s * count)
        return generation_pb2.GenerateResponse(
            token_ids=list(range(count)),
            text="x" * count,
            finish_reason=common_pb2.FINISH_REASON_LENGTH,
            usage=common_pb2.Usage(completion_tokens=count),
        )

    async def GenerateStream(
        self,
        request: generation_pb2.GenerateRequest,
        context: Context[generation_pb2.GenerateStreamResponse],
    ) -> AsyncIterator[generation_pb2.GenerateStreamResponse]:
        count = await self._admit(request, context)
        for token in range(count):
            await asyncio.sleep(self.token_delay_s)
            yield generation_pb2.GenerateStreamResponse(token_ids=[token], text="x")
        yield generation_pb2.GenerateStreamResponse(
            finish_reason=common_pb2.FINISH_REASON_LENGTH,
            usage=common_pb2.Usage(completion_tokens=count),
        )

    async def Info(
        self, request: generation_pb2.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> generation_pb2.InfoResponse:
        return generation_pb2.InfoResponse(model_name="fake", vocab_size=100)

    async def _admit(self, request: generation_pb2.GenerateRequest, context: Context[Any]) -> int:
        if request.prompt == REJECTED_PROMPT:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, REJECTION)
        return int(request.sampling.max_tokens or 4)


class FakeServer:
    """The fake servicer on 127.0.0.1:<free port>, served from a background event loop."""

    def __init__(self) -> None:
        self.servicer = FakeGeneration(token_delay_s=0.002)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: grpc.aio.Server | None = None
        self.target = ""

    def start(self) -> None:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)
        self.target = f"127.0.0.1:{port}"

    async def _serve(self) -> int:
        self._server = grpc.aio.server()
        generation_pb2_grpc.add_GenerationServicer_to_server(self.servicer, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return int(port)

    def stop(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(None), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    server = FakeServer()
    server.start()
    yield server
    server.stop()
