"""What must not reach a servicer: undecodable request bytes, and callers not allowed in.

grpc.aio runs a method's `request_deserializer` before the servicer sees the call; when it raises
(garbage bytes, a truncated message) grpc answers UNKNOWN and logs the whole traceback, once per
call: a flood of garbage would fill the log. `RequestGuard`, the interceptor on every pdserve
server, takes the deserializer out of each unary-request handler and runs it inside the handler
instead, where the call is refused with INVALID_ARGUMENT and one rate-limited log line. There,
before decoding, it also runs the server's peer check (mTLS identity, `tls.allowed_peers`).
Stream-request methods (reflection's, Decode.Multiplex) get the same: the peer check, then each
streamed message decoded inside the call, the first one before the method runs.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc
from prometheus_client import Counter

from pdserve.core.serving.tls import Context, PeerCheck

log = logging.getLogger(__name__)

UNDECODABLE = Counter(
    "pdserve_undecodable_requests",
    "Calls refused with INVALID_ARGUMENT because their request bytes did not decode",
    ["method"],
)
_LOG_INTERVAL_S = 10.0

Deserializer = Callable[[bytes], Any]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
# grpc's stubs type behaviours as synchronous; grpc.aio's are coroutines or async generators.
Unary = Callable[[Any, Context], Awaitable[Any]]
Streaming = Callable[[Any, Context], AsyncIterator[Any]]
Requests = AsyncIterator[Any]


class RateLimitedLog:
    """At most one line per interval; the line counts the events it stood for."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next_at = float("-inf")
        self._suppressed = 0

    def warning(self, message: str, *args: object) -> None:
        """Logs `message` (with how many were held back) unless one went out lately."""
        now = time.monotonic()
        if now < self._next_at:
            self._suppressed += 1
            return
        log.warning(message + " (%d more since the last report)", *args, self._suppressed)
        self._next_at, self._suppressed = now + self.interval_s, 0


_UNDECODABLE_LOG = RateLimitedLog(_LOG_INTERVAL_S)


async def decode_or_refuse(
    deserialize: Deserializer, raw: bytes, method: str, context: Context
) -> Any:
    try:
        return deserialize(raw)
    except Exception as error:  # protobuf raises DecodeError, but any failure here is the bytes'
        UNDECODABLE.labels(method).inc()
        _UNDECODABLE_LOG.warning("undecodable request to %s: %s", method, error)
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request: {len(raw)} bytes do not decode as this method's request message",
        )


@dataclass(frozen=True)
class _Admission:
    """Turns a call's raw bytes into its request, or ends the call."""

    method: str
    deserialize: Deserializer
    check_peer: PeerCheck | None

    async def request(self, raw: bytes, context: Context) -> Any:
        if self.check_peer is not None:
            await self.check_peer(context)
        return await self.decode(raw, context)

    async def decode(self, raw: bytes, context: Context) -> Any:
        return await decode_or_refuse(self.deserialize, raw, self.method, context)


def _guarded_unary(behavior: Unary, admission: _Admission) -> Unary:
    async def handle(raw: bytes, context: Context) -> Any:
        return await behavior(await admission.request(raw, context), context)

    return handle


def _guarded_stream(behavior: Streaming, admission: _Admission) -> Streaming:
    async def handle(raw: bytes, context: Context) -> AsyncIterator[Any]:
        request = await admission.request(raw, context)
        async for response in behavior(request, context):
            yield response

    return handle


async def _decoded(
    raw_requests: Requests, admission: _Admission, context: Context
) -> AsyncIterator[Any]:
    """A stream of requests, decoded one by one (a bad one ends the call INVALID_ARGUMENT). The
    first is read and decoded before the method runs, so a stream that starts with garbage is
    refused as a unary call is, whatever the method would have done."""
    if admission.check_peer is not None:
        await admission.check_peer(context)
    iterator = aiter(raw_requests)
    first: list[Any] = []  # empty when the stream ends before its first message
    async for raw in iterator:
        first.append(await admission.decode(raw, context))
        break

    async def requests() -> AsyncIterator[Any]:
        for request in first:
            yield request
        async for raw in iterator:
            yield await admission.decode(raw, context)

    return requests()


def _guarded_stream_request(handler: Handler, admission: _Admission) -> Handler:
    serialize = handler.response_serializer
    stream_stream: Any = handler.stream_stream
    if stream_stream is not None:
        if inspect.isasyncgenfunction(stream_stream):

            async def stream(raw_requests: Requests, context: Context) -> AsyncIterator[Any]:
                requests = await _decoded(raw_requests, admission, context)
                async for response in stream_stream(requests, context):
                    yield response

            return grpc.stream_stream_rpc_method_handler(stream, None, serialize)

        async def writes(raw_requests: Requests, context: Context) -> Any:
            return await stream_stream(await _decoded(raw_requests, admission, context), context)

        return grpc.stream_stream_rpc_method_handler(writes, None, serialize)
    stream_unary: Any = handler.stream_unary

    async def call(raw_requests: Requests, context: Context) -> Any:
        return await stream_unary(await _decoded(raw_requests, admission, context), context)

    return grpc.stream_unary_rpc_method_handler(call, None, serialize)


def guarded(handler: Handler, method: str, check_peer: PeerCheck | None) -> Handler:
    """The same handler, admitting the caller and decoding its request inside the call."""
    deserialize = handler.request_deserializer
    if deserialize is None:
        return handler
    admission = _Admission(method, deserialize, check_peer)
    if handler.request_streaming:
        return _guarded_stream_request(handler, admission)
    serialize = handler.response_serializer
    unary: Any = handler.unary_unary
    if unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _guarded_unary(unary, admission), None, serialize
        )
    streaming: Any = handler.unary_stream
    # grpc.aio allows both shapes: an async generator, or a coroutine that calls context.write.
    behavior: Any = (
        _guarded_stream(streaming, admission)
        if inspect.isasyncgenfunction(streaming)
        else _guarded_unary(streaming, admission)
    )
    return grpc.unary_stream_rpc_method_handler(behavior, None, serialize)


class RequestGuard(grpc.aio.ServerInterceptor):
    def __init__(self, check_peer: PeerCheck | None = None) -> None:
        self.check_peer = check_peer

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED itself
            return handler
        return guarded(handler, handler_call_details.method, self.check_peer)
