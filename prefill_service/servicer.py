"""`pdserve.v1.Prefill`: thin — decode the proto, call the engine, encode, map errors."""

from __future__ import annotations

import functools
from typing import Any, TypeAlias

import grpc

from pdserve.core.serving.grpc_errors import grpc_errors
from pdserve.core.serving.proto_convert import descriptor_from_proto
from pdserve.core.serving.tier_runtime import TierRuntime
from pdserve.core.serving.work_request import work_from_proto
from pdserve.prefill_service import metrics
from pdserve.prefill_service.engine import PrefillEngine
from pdserve.v1 import common_pb2, prefill_pb2, prefill_pb2_grpc

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


class PrefillServicer(prefill_pb2_grpc.PrefillServicer):
    def __init__(self, runtime: TierRuntime) -> None:
        self.runtime = runtime

    async def Prefill(
        self, request: prefill_pb2.PrefillRequest, context: Context
    ) -> prefill_pb2.PrefillResult:
        async with grpc_errors(context):
            self.runtime.check_accepting()
            work = work_from_proto(request.request)
            destination = descriptor_from_proto(request.destination)
            engine = self.runtime.engine(PrefillEngine)
            await self.runtime.compile_grammar(work.params.structured_outputs)
            # The caller going away (cancel, deadline) frees this tier's blocks.
            abort = functools.partial(engine.abort, work.request_id)
            pending = await self.runtime.call(
                lambda: engine.submit(
                    work.request_id,
                    work.prompt_token_ids,
                    work.params,
                    destination,
                    work.resumed_output_token_ids,
                ),
                undo=abort,
                prompt_tokens=len(work.prompt_token_ids) + len(work.resumed_output_token_ids),
            )
            outcome = await self.runtime.wait(pending, undo=abort)
            metrics.QUEUE_TIME.observe(outcome.queue_seconds)
            metrics.PREFILL_TIME.observe(outcome.prefill_seconds)
            metrics.TRANSFER_TIME.observe(outcome.transfer_seconds)
            metrics.PROMPT_TOKENS.inc(
                len(work.prompt_token_ids) + len(work.resumed_output_token_ids)
            )
            return prefill_pb2.PrefillResult(
                first_token_id=outcome.first_token_id,
                kv_bytes_sent=outcome.kv_bytes_sent,
                timings=prefill_pb2.PrefillTimings(
                    queue_seconds=outcome.queue_seconds,
                    prefill_seconds=outcome.prefill_seconds,
                    transfer_seconds=outcome.transfer_seconds,
                ),
            )

    async def Redirect(
        self, request: prefill_pb2.RedirectRequest, context: Context
    ) -> prefill_pb2.RedirectResult:
        """Taken while draining too: it moves work already accepted, adds none."""
        async with grpc_errors(context):
            destination = descriptor_from_proto(request.destination)
            engine = self.runtime.engine(PrefillEngine)
            redirected = await self.runtime.call(
                lambda: engine.redirect(request.request_id, destination)
            )
            metrics.REDIRECTS.labels("redirected" if redirected else "too_late").inc()
            return prefill_pb2.RedirectResult(redirected=redirected)

    async def Load(
        self, request: common_pb2.LoadRequest, context: Context
    ) -> common_pb2.LoadResponse:
        async with grpc_errors(context):
            self.runtime.engine(PrefillEngine)
            return self.runtime.load_reply()
