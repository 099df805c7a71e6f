"""`pdserve.v1.Decode`: thin — decode the proto, call the engine, encode, map errors.

A prefill worker serves this service too, over its own engine: GenerateLocal, Abort, Release and
Load work on any engine (the router lends an idle prefill worker streams); Reserve and Generate
need a decode worker's (FAILED_PRECONDITION elsewhere).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc

from pdserve.core.engine import LLMEngine
from pdserve.core.errors import RequestSuspended
from pdserve.core.serving.grpc_errors import grpc_errors
from pdserve.core.serving.proto_convert import (
    descriptor_from_proto,
    descriptor_to_proto,
    finish_reason_to_proto,
    load_to_proto,
)
from pdserve.core.serving.sampling_proto import sampling_from_proto
from pdserve.core.serving.tier_runtime import TierRuntime
from pdserve.decode_service import metrics
from pdserve.decode_service.engine import DecodeEngine, Suspension
from pdserve.decode_service.multiplex import MultiplexStream
from pdserve.decode_service.request_start import RequestStart, local_start, transferred_start
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


class DecodeServicer(decode_pb2_grpc.DecodeServicer):
    def __init__(self, runtime: TierRuntime) -> None:
        self.runtime = runtime

    async def Reserve(
        self, request: decode_pb2.ReserveRequest, context: Context
    ) -> common_pb2.TransferDescriptor:
        async with grpc_errors(context):
            started = time.monotonic()
            self.runtime.check_accepting()
            params = sampling_from_proto(request.sampling, request.priority)
            engine = self.runtime.engine(DecodeEngine)
            prompt = list(request.prompt_token_ids)
            resumed = list(request.resumed_output_token_ids)
            abort = functools.partial(engine.abort, request.request_id)
            live = request.live_migration
            granted = await self.runtime.call(
                lambda: engine.reserve(request.request_id, prompt, params, resumed, live),
                undo=abort,
            )
            descriptor = await self.runtime.wait(granted, undo=abort)
            metrics.QUEUE_TIME.observe(time.monotonic() - started)
            return descriptor_to_proto(descriptor)

    async def Generate(
        self, request: decode_pb2.DecodeRequest, context: Context
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        async with grpc_errors(context):
            starting = transferred_start(self.runtime, request)
            async for message in self._relay(request.request_id, starting):
                yield message

    async def GenerateLocal(
        self, request: decode_pb2.GenerateLocalRequest, context: Context
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        async with grpc_errors(context):
            starting = local_start(self.runtime, request)
            async for message in self._relay(request.request_id, starting):
                yield message

    async def _relay(
        self, request_id: str, starting: RequestStart
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        """The request's deltas as protos, timed. Once this worker drains, a decode worker's
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
        async for delta in self.runtime.stream(request_id, starting.start):
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
            async for step in MultiplexStream(self.runtime).serve(request_iterator):
                yield step

    async def Suspend(
        self, request: decode_pb2.SuspendRequest, context: Context
    ) -> decode_pb2.SuspendResponse:
        async with grpc_errors(context):
            engine = self.runtime.engine(DecodeEngine)
            outcome = await self.runtime.call(lambda: engine.suspend(request.request_id))
            return decode_pb2.SuspendResponse(
                suspended=outcome is not Suspension.NOT_RUNNING,
                kv_ready=outcome is Suspension.KV_READY,
            )

    async def Migrate(
        self, request: decode_pb2.MigrateRequest, context: Context
    ) -> decode_pb2.MigrateResponse:
        async with grpc_errors(context):
            engine = self.runtime.engine(DecodeEngine)
            destination = descriptor_from_proto(request.destination)
            sending = await self.runtime.call(
                lambda: engine.migrate(request.request_id, destination)
            )
            result = await asyncio.wrap_future(sending)
            metrics.LIVE_MIGRATION_SECONDS.observe(result.seconds)
            return decode_pb2.MigrateResponse(
                kv_bytes=result.nbytes, transfer_seconds=result.seconds
            )

    async def Release(
        self, request: decode_pb2.ReleaseRequest, context: Context
    ) -> decode_pb2.ReleaseResponse:
        return decode_pb2.ReleaseResponse(released=await self._release(request.request_id, context))

    async def _release(self, request_id: str, context: Context) -> bool:
        async with grpc_errors(context):
            engine = self.runtime.engine(LLMEngine)  # a lent prefill worker's streams too
            return await self.runtime.call(lambda: engine.release(request_id))

    async def Abort(
        self, request: decode_pb2.AbortRequest, context: Context
    ) -> decode_pb2.AbortResponse:
        # Abort and Release differ only in the caller's intent; both free everything.
        return decode_pb2.AbortResponse(aborted=await self._release(request.request_id, context))

    async def Load(
        self, request: common_pb2.LoadRequest, context: Context
    ) -> common_pb2.LoadResponse:
        async with grpc_errors(context):
            engine = self.runtime.engine(LLMEngine)
            return load_to_proto(engine.load(), engine.scheduler.kv_manager.block_pool)
