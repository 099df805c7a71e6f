"""The router's one request path, shared by both doors (gRPC `Generation` and OpenAI HTTP).

    admitted(request)  --max-queue places, one per sample (else RESOURCE_EXHAUSTED at once),
                       validation (INVALID_ARGUMENT naming the field), the router's own id
    deltas(...)        the dispatcher's token deltas; closing it early (aclosing) runs the
                       dispatcher's cleanup, which cancels the request on both tiers

A door turns its own request shape into a `GenerateRequest`, then calls these two in turn, so
limits, ids and cancellation behave the same whichever door a request came in by.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import grpc

from pdserve.router import metrics
from pdserve.router.clock import Deadline, RequestClock
from pdserve.router.config import RouterConfig
from pdserve.router.dispatch import Dispatcher
from pdserve.router.errors import RouterError
from pdserve.router.samples import stream_count
from pdserve.router.validation import RequestValidator, ValidatedRequest
from pdserve.v1 import common_pb2, decode_pb2, generation_pb2

_LOADING = "router: still loading the model's tokenizer"


class Admission:
    """Admission and validation for every public request."""

    def __init__(self, dispatcher: Dispatcher, config: RouterConfig) -> None:
        self.dispatcher = dispatcher
        self.config = config
        # None until the model's tokenizer and limits have loaded; calls before get UNAVAILABLE.
        self.validator: RequestValidator | None = None
        self._in_flight = 0

    @contextlib.asynccontextmanager
    async def admitted(
        self, request: generation_pb2.GenerateRequest
    ) -> AsyncIterator[ValidatedRequest]:
        """--max-queue places, one per stream the request runs (each of its samples), held
        until the call ends, and the validated request.

        Too few places free means RESOURCE_EXHAUSTED at once: the router never queues
        unboundedly.
        """
        streams = stream_count(request, self.config.max_queue)
        if self._in_flight + streams > self.config.max_queue:
            raise RouterError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"router: {self._in_flight} streams in flight, this request runs {streams} "
                f"(--max-queue {self.config.max_queue}); retry later",
            )
        self._in_flight += streams
        metrics.IN_FLIGHT.set(self._in_flight)
        try:
            yield await self.loaded_validator().validate(request)
        finally:
            self._in_flight -= streams
            metrics.IN_FLIGHT.set(self._in_flight)

    def loaded_validator(self) -> RequestValidator:
        if self.validator is None:
            raise RouterError(grpc.StatusCode.UNAVAILABLE, _LOADING)
        return self.validator

    async def deltas(
        self, request: ValidatedRequest, deadline: Deadline, clock: RequestClock
    ) -> AsyncGenerator[decode_pb2.TokenDelta, None]:
        """The request's token deltas, the last one with a finish reason (else INTERNAL)."""
        finished = False
        stream = self.dispatcher.stream(request, deadline, clock)
        async with contextlib.aclosing(stream) as deltas:
            async for delta in deltas:
                clock.on_tokens(len(delta.token_ids))
                finished = is_finished(delta)
                if finished:
                    clock.on_finished(len(request.prompt_token_ids))
                yield delta
        if not finished:
            raise RouterError(
                grpc.StatusCode.INTERNAL, "router: decode stream ended without a finish reason"
            )


def is_finished(delta: decode_pb2.TokenDelta) -> bool:
    return bool(delta.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED)


def usage(
    request: ValidatedRequest, delta: decode_pb2.TokenDelta, clock: RequestClock
) -> common_pb2.Usage:
    """Decode's counts (it sends them on the last delta); the router's own as a fallback."""
    if delta.HasField("usage"):
        return delta.usage
    return common_pb2.Usage(
        prompt_tokens=len(request.prompt_token_ids), completion_tokens=clock.num_tokens
    )
