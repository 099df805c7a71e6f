"""`pdserve.v1.Generation`: the public API, on top of the Dispatcher.

Each call: admission (at most --max-queue in flight, else RESOURCE_EXHAUSTED at once) ->
validation (tokenize, limits; INVALID_ARGUMENT naming the field) -> the dispatcher's token
deltas, relayed as stream chunks or gathered into one answer. Any failure ends this call only,
with the code `errors.to_status` picks; the server keeps serving the others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeAlias

import grpc

from pdserve.router import metrics
from pdserve.router.admission import Admission, is_finished, usage
from pdserve.router.clock import RequestClock
from pdserve.router.dispatch import Deadline
from pdserve.router.errors import RouterError, retry_after, to_status
from pdserve.router.samples import (
    clocks_for,
    gather_all,
    interleave,
    merge_responses,
    sample_requests,
)
from pdserve.router.tenants import tenant_of
from pdserve.router.validation import ValidatedRequest
from pdserve.v1 import decode_pb2, generation_pb2, generation_pb2_grpc

SERVICE_NAME = "pdserve.v1.Generation"
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
# A cancel this close to the deadline (transit + grpc-timeout rounding) is the deadline.
_DEADLINE_SLACK_S = 0.05
_DEADLINE_SLACK_FRACTION = 0.02


# unused-ignore: the ignore is needed only while mypy cannot resolve pdserve.v1 (then Any).
class RouterServicer(generation_pb2_grpc.GenerationServicer):  # type: ignore[misc, unused-ignore]
    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: Context
    ) -> generation_pb2.GenerateResponse:
        clock = RequestClock()
        tenant = self._tenant(context)
        async with (
            self._answering("Generate", context),
            self.admission.admitted(request, tenant) as valid,
        ):
            samples = sample_requests(valid)
            clocks = clocks_for(samples, clock)
            calls = [self._collect(s, context, c) for s, c in zip(samples, clocks, strict=True)]
            return merge_responses(valid.client_request_id, await gather_all(calls))
        raise AssertionError("unreachable: _answering re-raises or aborts the call")

    async def GenerateStream(
        self, request: generation_pb2.GenerateRequest, context: Context
    ) -> AsyncIterator[generation_pb2.GenerateStreamResponse]:
        clock = RequestClock()
        tenant = self._tenant(context)
        async with (
            self._answering("GenerateStream", context),
            self.admission.admitted(request, tenant) as valid,
        ):
            samples = sample_requests(valid)
            if len(samples) == 1:
                async with contextlib.aclosing(self._deltas(valid, context, clock)) as deltas:
                    async for delta in deltas:
                        yield _chunk(valid, delta, clock)
                return
            clocks = clocks_for(samples, clock)
            streams = [self._deltas(s, context, c) for s, c in zip(samples, clocks, strict=True)]
            async with contextlib.aclosing(interleave(streams)) as chunks:
                async for index, delta in chunks:
                    chunk = _chunk(samples[index], delta, clocks[index])
                    chunk.sample_index = index
                    yield chunk

    async def Info(
        self, request: generation_pb2.InfoRequest, context: Context
    ) -> generation_pb2.InfoResponse:
        try:
            limits = self.admission.loaded_validator().limits
        except RouterError as error:
            await context.abort(error.code, error.message)
            raise  # unreachable: abort raises
        return generation_pb2.InfoResponse(
            model_name=limits.model_name,
            vocab_size=limits.vocab_size,
            max_context_length=limits.max_position,
            block_size=self.admission.dispatcher.block_size,
            limits=generation_pb2.Limits(
                max_prompt_tokens=limits.max_prompt_tokens,
                max_tokens=limits.max_tokens,
                max_stop_strings=limits.max_stop_strings,
                max_queued_requests=self.admission.config.max_queue,
            ),
            eos_token_ids=list(limits.eos_token_ids),
        )

    def _tenant(self, context: Context) -> str:
        """The call's tenant: an API key or tenant header in its metadata, else the names on
        its client certificate (mTLS), else `default` (router/tenants.py)."""
        auth = context.auth_context()
        names = [
            name.decode(errors="replace")
            for key in ("x509_common_name", "x509_subject_alternative_name")
            for name in auth.get(key, [])
        ]
        return tenant_of(self.admission.tenants, context.invocation_metadata() or (), names)

    @contextlib.asynccontextmanager
    async def _answering(self, method: str, context: Context) -> AsyncIterator[None]:
        """Ends the call with the status `to_status` picks, and counts it by code."""
        code = grpc.StatusCode.OK
        window = context.time_remaining()
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            code = _cancel_code(window, context.time_remaining())
            raise
        except Exception as error:
            code, message = to_status(error)
            await context.abort(code, message, trailing_metadata=_pushback(error))
        finally:
            metrics.REQUESTS.labels(method, code.name).inc()

    def _deltas(
        self, request: ValidatedRequest, context: Context, clock: RequestClock
    ) -> AsyncGenerator[decode_pb2.TokenDelta, None]:
        deadline = Deadline.after(context.time_remaining())
        return self.admission.deltas(request, deadline, clock)

    async def _collect(
        self, request: ValidatedRequest, context: Context, clock: RequestClock
    ) -> generation_pb2.GenerateResponse:
        response = generation_pb2.GenerateResponse(request_id=request.client_request_id)
        texts: list[str] = []
        async with contextlib.aclosing(self._deltas(request, context, clock)) as deltas:
            async for delta in deltas:
                response.token_ids.extend(delta.token_ids)
                texts.append(delta.text)
                if is_finished(delta):
                    response.finish_reason = delta.finish_reason
                    response.usage.CopyFrom(usage(request, delta, clock))
                    response.timings.CopyFrom(clock.to_proto())
        response.text = "".join(texts)
        return response


def _pushback(error: BaseException) -> tuple[tuple[str, str], ...]:
    """gRPC's retry pushback trailer (`grpc-retry-pushback-ms`, the gRPC retry design A6) when
    the router says when a retry may succeed."""
    seconds = retry_after(error)
    return () if seconds is None else (("grpc-retry-pushback-ms", str(round(seconds * 1000))),)


def _cancel_code(window: float | None, remaining: float | None) -> grpc.StatusCode:
    """Why gRPC cancelled the handler: the client's cancel or its deadline.

    The client's deadline fires on its own clock and reaches us as a plain cancel (RST_STREAM, the
    frame a user's cancel sends too) while our copy of the deadline still has a little time left:
    the grpc-timeout header is rounded up when encoded, and transit adds to it. So a cancel that
    close to our deadline is the deadline (docs/contract.md counts those DEADLINE_EXCEEDED)."""
    if window is None or remaining is None:
        return grpc.StatusCode.CANCELLED
    slack = _DEADLINE_SLACK_S + _DEADLINE_SLACK_FRACTION * window
    return grpc.StatusCode.DEADLINE_EXCEEDED if remaining <= slack else grpc.StatusCode.CANCELLED


def _chunk(
    request: ValidatedRequest, delta: decode_pb2.TokenDelta, clock: RequestClock
) -> generation_pb2.GenerateStreamResponse:
    chunk = generation_pb2.GenerateStreamResponse(
        request_id=request.client_request_id,
        token_ids=delta.token_ids,
        text=delta.text,
        finish_reason=delta.finish_reason,
    )
    if is_finished(delta):
        chunk.usage.CopyFrom(usage(request, delta, clock))
        chunk.timings.CopyFrom(clock.to_proto())
    return chunk
