"""A small typed client of the public `pdserve.v1.Generation` API, over grpc.aio.

    async with GenerationClient.connect("127.0.0.1:50051") as client:
        reply = await client.generate(build_request("Hello", sampling=SamplingParams(max_tokens=8)))
        async for chunk in client.generate_stream(build_request([1, 2, 3])):
            print(chunk.text, end="")

Light on purpose: it imports grpc and the generated modules only, never torch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeAlias

import grpc

from pdserve.core.serving.keepalive import Keepalive
from pdserve.v1 import common_pb2, generation_pb2, generation_pb2_grpc

if TYPE_CHECKING:
    from pdserve.v1.generation_pb2_grpc import GenerationAsyncStub

DEFAULT_TARGET = "127.0.0.1:50051"
Metadata: TypeAlias = Sequence[tuple[str, str]]

SamplingParams = common_pb2.SamplingParams
GenerateRequest = generation_pb2.GenerateRequest
GenerateResponse = generation_pb2.GenerateResponse
GenerateStreamResponse = generation_pb2.GenerateStreamResponse
InfoResponse = generation_pb2.InfoResponse


def build_request(
    prompt: str | Sequence[int],
    *,
    sampling: common_pb2.SamplingParams | None = None,
    priority: int = 0,
    request_id: str | None = None,
) -> generation_pb2.GenerateRequest:
    """A GenerateRequest from prompt text or token ids; a bad prompt raises ValueError naming it."""
    request = generation_pb2.GenerateRequest(priority=priority)
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt: must not be empty")
        request.prompt = prompt
    else:
        _check_token_ids(prompt)
        request.prompt_token_ids.ids.extend(prompt)
    if sampling is not None:
        request.sampling.CopyFrom(sampling)
    if request_id is not None:
        request.request_id = request_id
    return request


def _check_token_ids(token_ids: Sequence[int]) -> None:
    if not token_ids:
        raise ValueError("prompt_token_ids: must not be empty")
    negative = [token for token in token_ids if token < 0]
    if negative:
        raise ValueError(f"prompt_token_ids: token ids must be >= 0, got {negative[:5]}")


class GenerationClient:
    """Typed async calls on one channel; use `connect` and `async with` to own the channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel
        self._stub: GenerationAsyncStub = generation_pb2_grpc.GenerationStub(channel)

    @classmethod
    def connect(
        cls, target: str = DEFAULT_TARGET, credentials: grpc.ChannelCredentials | None = None
    ) -> GenerationClient:
        """A client on a new channel to `target` ("host:port"): TLS with `credentials`
        (`grpc.ssl_channel_credentials(ca)`), else plaintext."""
        if not target:
            raise ValueError("target: must be host:port, got an empty string")
        options = Keepalive().channel_options()  # a vanished router fails the call
        if credentials is None:
            return cls(grpc.aio.insecure_channel(target, options=options))
        return cls(grpc.aio.secure_channel(target, credentials, options=options))

    async def generate(
        self,
        request: generation_pb2.GenerateRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata = (),
    ) -> generation_pb2.GenerateResponse:
        """The whole completion in one answer; errors raise grpc.aio.AioRpcError."""
        return await self._stub.Generate(request, timeout=timeout, metadata=tuple(metadata))

    def generate_stream(
        self,
        request: generation_pb2.GenerateRequest,
        *,
        timeout: float | None = None,
        metadata: Metadata = (),
    ) -> AsyncIterator[generation_pb2.GenerateStreamResponse]:
        """The completion chunk by chunk; leaving the loop early cancels the call."""
        call = self._stub.GenerateStream(request, timeout=timeout, metadata=tuple(metadata))
        return _iterate_then_cancel(call)

    async def info(
        self, *, timeout: float | None = None, metadata: Metadata = ()
    ) -> generation_pb2.InfoResponse:
        """The served model and its limits."""
        request = generation_pb2.InfoRequest()
        return await self._stub.Info(request, timeout=timeout, metadata=tuple(metadata))

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


async def _iterate_then_cancel(
    call: grpc.aio.UnaryStreamCall[
        generation_pb2.GenerateRequest, generation_pb2.GenerateStreamResponse
    ],
) -> AsyncIterator[generation_pb2.GenerateStreamResponse]:
    # Cancelling a finished call is a no-op; cancelling an abandoned one frees the server's work.
    try:
        async for chunk in call:
            yield chunk
    finally:
        call.cancel()
