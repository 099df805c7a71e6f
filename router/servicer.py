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
from pdserve.router.clock import RequestClock
from pdserve.router.config import RouterConfig
from pdserve.router.dispatch import Deadline, Dispatcher
from pdserve.router.errors import RouterError, to_status
from pdserve.router.validation import RequestValidator, ValidatedRequest
from pdserve.v1 import common_pb2, decode_pb2, generation_pb2, generation_pb2_grpc

SERVICE_NAME = "pdserve.v1.Generation"
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
_LOADING = "router: still loading the model's tokenizer"
# A cancel this close to the deadline (transit + grpc-timeout rounding) is the deadline.
_DEADLINE_SLACK_S = 0.05
_DEADLINE_SLACK_FRACTION = 0.02


# unused-ignore: the ignore is needed only while mypy cannot resolve pdserve.v1 (then Any).
class RouterServicer(generation_pb2_grpc.GenerationServicer):  # type: ignore[misc, unused-ignore]
    def __init__(self, dispatcher: Dispatcher, config: RouterConfig) -> None:
        self.dispatcher = dispatcher
        self.config = config
        # None until the model's tokenizer and limits have loaded; calls before get UNAVAILABLE.
        self.validator: RequestValidator | None = None
        self._in_flight = 0
        self._request_ids: set[str] = set()

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: Context
    ) -> generation_pb2.GenerateResponse:
        clock = RequestClock()
        async with self._answering("Generate", context), self._admitted(request) as valid:
            return await self._collect(valid, context, clock)
        raise AssertionError("unreachable: _answering re-raises or aborts the call")

    async def GenerateStream(
        self, request: generation_pb2.GenerateRequest, context: Context
    ) -> AsyncIterator[generation_pb2.GenerateStreamResponse]:
        clock = RequestClock()
        async with (
            self._answering("GenerateStream", context),
            self._admitted(request) as valid,
            contextlib.aclosing(self._deltas(valid, context, clock)) as deltas,
        ):
            async for delta in deltas:
                yield _chunk(valid, delta, clock)

    async def Info(
        self, request: generation_pb2.InfoRequest, context: Context
    ) -> generation_pb2.InfoResponse:
        try:
            limits = self._loaded_validator().limits
        except RouterError as error:
            await context.abort(error.code, error.message)
            raise  # unreachable: abort raises
        return generation_pb2.InfoResponse(
            model_name=limits.model_name,
            vocab_size=limits.vocab_size,
            max_context_length=limits.max_position,
            block_size=self.dispatcher.block_size,
            limits=generation_pb2.Limits(
                max_prompt_tokens=limits.max_prompt_tokens,
                max_tokens=limits.max_tokens,
                max_stop_strings=limits.max_stop_strings,
                max_queued_requests=self.config.max_queue,
            ),
            eos_token_ids=list(limits.eos_token_ids),
        )

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
            await context.abort(code, message)
        finally:
            metrics.REQUESTS.labels(method, code.name).inc()

    @contextlib.asynccontextmanager
    async def _admitted(
        self, request: generation_pb2.GenerateRequest
    ) -> AsyncIterator[ValidatedRequest]:
        """A --max-queue place and the request id, held until the call ends.

        No place free means RESOURCE_EXHAUSTED at once: the router never queues unboundedly.
        """
        if self._in_flight >= self.config.max_queue:
            raise RouterError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"router: {self._in_flight} requests in flight (--max-queue "
                f"{self.config.max_queue}); retry later",
            )
        self._in_flight += 1
        metrics.IN_FLIGHT.set(self._in_flight)
        try:
            valid = await self._loaded_validator().validate(request)
            if valid.request_id in self._request_ids:
                raise RouterError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"request_id: {valid.request_id!r} is already in flight",
                )
            self._request_ids.add(valid.request_id)
            try:
                yield valid
            finally:
                self._request_ids.discard(valid.request_id)
        finally:
            self._in_flight -= 1
            metrics.IN_FLIGHT.set(self._in_flight)

    def _loaded_validator(self) -> RequestValidator:
        if self.validator is None:
            raise RouterError(grpc.StatusCode.UNAVAILABLE, _LOADING)
        return self.validator

    async def _deltas(
        self, request: ValidatedRequest, context: Context, clock: RequestClock
    ) -> AsyncGenerator[decode_pb2.TokenDelta, None]:
        deadline = Deadline.after(context.time_remaining())
        finished = False
        stream = self.dispatcher.stream(request, deadline, clock)
        async with contextlib.aclosing(stream) as deltas:
            async for delta in deltas:
                clock.on_tokens(len(delta.token_ids))
                finished = _finished(delta)
                if finished:
                    clock.on_finished()
                yield delta
        if not finished:
            raise RouterError(
                grpc.StatusCode.INTERNAL, "router: decode stream ended without a finish reason"
            )

    async def _collect(
        self, request: ValidatedRequest, context: Context, clock: RequestClock
    ) -> generation_pb2.GenerateResponse:
        response = generation_pb2.GenerateResponse(request_id=request.request_id)
        texts: list[str] = []
        async with contextlib.aclosing(self._deltas(request, context, clock)) as deltas:
            async for delta in deltas:
                response.token_ids.extend(delta.token_ids)
                texts.append(delta.text)
                if _finished(delta):
                    response.finish_reason = delta.finish_reason
                    response.usage.CopyFrom(_usage(request, delta, clock))
                    response.timings.CopyFrom(clock.to_proto())
        response.text = "".join(texts)
        return response


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


def _finished(delta: decode_pb2.TokenDelta) -> bool:
    return bool(delta.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED)


def _usage(
    request: ValidatedRequest, delta: decode_pb2.TokenDelta, clock: RequestClock
) -> common_pb2.Usage:
    """Decode's counts (it sends them on the last delta); the router's own as a fallback."""
    if delta.HasField("usage"):
        return delta.usage
    return common_pb2.Usage(
        prompt_tokens=len(request.prompt_token_ids), completion_tokens=clock.num_tokens
    )


def _chunk(
    request: ValidatedRequest, delta: decode_pb2.TokenDelta, clock: RequestClock
) -> generation_pb2.GenerateStreamResponse:
    chunk = generation_pb2.GenerateStreamResponse(
        request_id=request.request_id,
        token_ids=delta.token_ids,
        text=delta.text,
        finish_reason=delta.finish_reason,
    )
    if _finished(delta):
        chunk.usage.CopyFrom(_usage(request, delta, clock))
        chunk.timings.CopyFrom(clock.to_proto())
    return chunk
