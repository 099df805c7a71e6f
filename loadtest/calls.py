"""One call against the public API, timed the way ghz times it, plus token timings for streams."""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc

from pdserve.client import GenerationClient, Metadata
from pdserve.loadtest.calldata import RequestMessage
from pdserve.loadtest.config import Method
from pdserve.v1 import generation_pb2


@dataclass(frozen=True)
class CallResult:
    """What one call did; `status` and `error` are spelled as ghz spells them."""

    started_at: float  # wall clock (time.time()) when the call was sent
    latency_ns: int  # send until the answer (or the stream's end) arrived
    status: str  # Go gRPC code name: "OK", "InvalidArgument", "Canceled", ...
    error: str = ""  # "rpc error: code = ... desc = ..." when status is not OK
    output_tokens: int = 0
    first_token_ns: int | None = None  # streams only: send until the first token arrived
    token_gaps_ns: tuple[int, ...] = ()  # streams only: gaps between token-carrying chunks
    request_number: int | None = None  # which of the run's requests (i: data[i % len(data)])

    @property
    def ok(self) -> bool:
        return not self.error


def ghz_status_name(code: grpc.StatusCode) -> str:
    """Go's name of a status code (what ghz writes): INVALID_ARGUMENT -> "InvalidArgument"."""
    if code is grpc.StatusCode.OK:
        return "OK"
    if code is grpc.StatusCode.CANCELLED:
        return "Canceled"  # Go spells it with one "l"
    return "".join(part.capitalize() for part in code.name.split("_"))


def error_result(
    started_at: float, started_ns: int, code: grpc.StatusCode, details: str
) -> CallResult:
    name = ghz_status_name(code)
    return CallResult(
        started_at=started_at,
        latency_ns=time.perf_counter_ns() - started_ns,
        status=name,
        error=f"rpc error: code = {name} desc = {details}",
    )


@dataclass(frozen=True)
class CallSettings:
    """Per-call options from the config."""

    method: Method
    timeout_s: float | None  # None: no deadline (ghz's timeout 0)
    metadata: Metadata


async def make_call(
    client: GenerationClient, request: RequestMessage, settings: CallSettings, started_ns: int
) -> CallResult:
    """Send one request; an RPC error becomes a result, anything else is a bug and propagates."""
    started_at = time.time()
    try:
        if settings.method is Method.GENERATE_STREAM:
            return await _stream(client, _as_generate(request), settings, started_at, started_ns)
        tokens = 0
        if settings.method is Method.GENERATE:
            reply = await client.generate(
                _as_generate(request), timeout=settings.timeout_s, metadata=settings.metadata
            )
            tokens = len(reply.token_ids)
        else:
            await client.info(timeout=settings.timeout_s, metadata=settings.metadata)
    except grpc.aio.AioRpcError as error:
        return error_result(started_at, started_ns, error.code(), error.details() or "")
    latency = time.perf_counter_ns() - started_ns
    return CallResult(started_at, latency, "OK", output_tokens=tokens)


async def _stream(
    client: GenerationClient,
    request: generation_pb2.GenerateRequest,
    settings: CallSettings,
    started_at: float,
    started_ns: int,
) -> CallResult:
    first_token_ns: int | None = None
    last_token_at = started_ns
    gaps: list[int] = []
    tokens = 0
    chunks = client.generate_stream(request, timeout=settings.timeout_s, metadata=settings.metadata)
    async for chunk in chunks:
        if not chunk.token_ids:
            continue  # the closing chunk may carry only finish reason, usage and timings
        now = time.perf_counter_ns()
        if first_token_ns is None:
            first_token_ns = now - started_ns
        else:
            gaps.append(now - last_token_at)
        last_token_at = now
        tokens += len(chunk.token_ids)
    latency = time.perf_counter_ns() - started_ns
    return CallResult(started_at, latency, "OK", "", tokens, first_token_ns, tuple(gaps))


def _as_generate(request: RequestMessage) -> generation_pb2.GenerateRequest:
    if not isinstance(request, generation_pb2.GenerateRequest):
        raise TypeError(f"expected a GenerateRequest, got {type(request).__name__}")
    return request
