"""`pdserve.v1.Decode`'s engine-agnostic half: the calls any worker serves over its own engine.

GenerateLocal (prefill and decode here), Multiplex (the router's one stream for all its requests
here), Release / Abort and Load work on any engine: a decode worker serves them, and so does a
prefill worker, for the streams the router lends it when the prefill tier idles (role-flexible
workers, docs/router.md). A decode worker's servicer adds Reserve, Generate, Suspend and Migrate
(decode_service/servicer.py); a worker without them answers those FAILED_PRECONDITION.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, NoReturn, TypeAlias

import grpc

from pdserve.core.engine import LLMEngine
from pdserve.core.errors import RequestSuspended
from pdserve.core.serving import stream_metrics as metrics
from pdserve.core.serving.grpc_errors import grpc_errors
from pdserve.core.serving.multiplex import MultiplexStream
from pdserve.core.serving.proto_convert import finish_reason_to_proto
from pdserve.core.serving.request_start import (
    RequestStart,
    StartTransferred,
    local_start,
    refuse_transferred,
)
from pdserve.core.serving.tier_runtime import TierRuntime
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


class StreamServicer(decode_pb2_grpc.DecodeServicer):
    def __init__(
        self, runtime: TierRuntime, start_transferred: StartTransferred = refuse_transferred
    ) -> None:
        self.runtime = runtime
        self.start_transferred = start_transferred  # Multiplex's `generate` commands

    async def GenerateLocal(
        self, request: decode_pb2.GenerateLocalRequest, context: Context
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        async with grpc_errors(context):
            starting = local_start(self.runtime, request)
            await self.runtime.compile_grammar(starting.structured)
            async for message in self.relay(request.request.request_id, starting):
                yield message

    async def relay(
        self, request_id: str, starting: RequestStart
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        """The request's deltas as protos, timed. Once this worker drains, a movable request's
        deltas say so (the router may move the stream: Suspend), and a suspended stream ends
        with a `suspended` delta."""
        started = time.monotonic()
        try:
            async for message in self._deltas(request_id, starting, started):
                message.draining = starting.movable and self.runtime.host.draining
                yield message
        except RequestSuspended:
            yield decode_pb2.TokenDelta(request_id=request_id, suspended=True)

    async def _deltas(
        self,
        request_id: str,
        starting: RequestStart,
        started: float,
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        last = started
        streamed = 0
        usage = starting.usage
        async for delta in self.runtime.stream(request_id, starting.start, starting.prompt_tokens):
            now = time.monotonic()
            histogram = metrics.INTER_TOKEN_LATENCY if streamed else metrics.TIME_TO_FIRST_TOKEN
            histogram.observe(now - last)
            last = now
            streamed += len(delta.new_token_ids)
            metrics.TOKENS.inc(len(delta.new_token_ids))
            message = decode_pb2.TokenDelta(
                request_id=delta.request_id,
                token_ids=list(delta.new_token_ids),
                text=delta.text,
                finish_reason=finish_reason_to_proto(delta.finish_reason),
            )
            if delta.finished:
                message.usage.prompt_tokens = usage.prompt_tokens
                message.usage.completion_tokens = usage.completion_tokens + streamed
                message.timings.decode_seconds = now - started
            yield message

    async def Multiplex(
        self, request_iterator: AsyncIterator[decode_pb2.MultiplexCommand], context: Context
    ) -> AsyncIterator[decode_pb2.DecodeStep]:
        async with grpc_errors(context):
            stream = MultiplexStream(self.runtime, self.start_transferred)
            async for step in stream.serve(request_iterator):
                yield step

    async def Release(
        self, request: decode_pb2.ReleaseRequest, context: Context
    ) -> decode_pb2.ReleaseResponse:
        return decode_pb2.ReleaseResponse(released=await self._release(request.request_id, context))

    async def _release(self, request_id: str, context: Context) -> bool:
        async with grpc_errors(context):
            engine = self.runtime.engine(LLMEngine)
            return await self.runtime.call(lambda: engine.release(request_id))

    async def Abort(
        self, request: decode_pb2.AbortRequest, context: Context
    ) -> decode_pb2.AbortResponse:
        # Abort and Release differ only in the caller's intent; both free everything.
        return decode_pb2.AbortResponse(aborted=await self._release(request.request_id, context))

    # A decode worker's calls (decode_service/servicer.py overrides them).

    async def Reserve(
        self, request: decode_pb2.ReserveRequest, context: Context
    ) -> common_pb2.TransferDescriptor:
        await _needs_a_decode_worker("Reserve", context)

    async def Generate(
        self, request: decode_pb2.DecodeRequest, context: Context
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        await _needs_a_decode_worker("Generate", context)
        yield decode_pb2.TokenDelta()  # never reached: makes this an async generator

    async def Suspend(
        self, request: decode_pb2.SuspendRequest, context: Context
    ) -> decode_pb2.SuspendResponse:
        await _needs_a_decode_worker("Suspend", context)

    async def Migrate(
        self, request: decode_pb2.MigrateRequest, context: Context
    ) -> decode_pb2.MigrateResponse:
        await _needs_a_decode_worker("Migrate", context)

    async def Load(
        self, request: common_pb2.LoadRequest, context: Context
    ) -> common_pb2.LoadResponse:
        async with grpc_errors(context):
            self.runtime.engine(LLMEngine)
            return self.runtime.load_reply()


async def _needs_a_decode_worker(call: str, context: Context) -> NoReturn:
    await context.abort(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"Decode.{call} needs a decode worker; this worker serves lent streams only",
    )
