"""`pdserve.v1.Decode` on a decode worker: thin — decode the proto, call the engine, encode, map
errors. The calls any worker serves (GenerateLocal, Multiplex, Release, Abort, Load) are
core/serving/stream_servicer.py's; this adds those that need a decode worker's reservations and
KV: Reserve, Generate, Suspend and Migrate.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator

from pdserve.core.serving.grpc_errors import grpc_errors
from pdserve.core.serving.proto_convert import descriptor_from_proto, descriptor_to_proto
from pdserve.core.serving.stream_servicer import Context, StreamServicer
from pdserve.core.serving.tier_runtime import TierRuntime
from pdserve.core.serving.work_request import work_from_proto
from pdserve.decode_service import metrics
from pdserve.decode_service.engine import DecodeEngine, Suspension
from pdserve.decode_service.transferred_start import transferred_start
from pdserve.v1 import common_pb2, decode_pb2


class DecodeServicer(StreamServicer):
    def __init__(self, runtime: TierRuntime) -> None:
        super().__init__(runtime, transferred_start)

    async def Reserve(
        self, request: decode_pb2.ReserveRequest, context: Context
    ) -> common_pb2.TransferDescriptor:
        async with grpc_errors(context):
            started = time.monotonic()
            self.runtime.check_accepting()
            work = work_from_proto(request.request)
            engine = self.runtime.engine(DecodeEngine)
            await self.runtime.compile_grammar(work.params.structured_outputs)
            abort = functools.partial(engine.abort, work.request_id)
            live = request.live_migration
            granted = await self.runtime.call(
                lambda: engine.reserve(
                    work.request_id,
                    work.prompt_token_ids,
                    work.params,
                    work.resumed_output_token_ids,
                    live,
                ),
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
            async for message in self.relay(request.request_id, starting):
                yield message

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
