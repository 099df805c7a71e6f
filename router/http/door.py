"""One OpenAI request through the router's shared request path, answered whole or as SSE.

Both answers run `Admission.admitted` then `Admission.deltas` per sample (`n` fans out as in
router/samples.py), as the gRPC door does. Streams
start only once the first token is out, so admission, validation and routing failures still get
their own HTTP status (400, 429, 503) rather than an error event inside a 200 stream.

Cancellation: uvicorn does not cancel a handler when its client goes away, so the work runs in
a task that `until_disconnect` cancels on `http.disconnect`; once streaming, Starlette cancels
the body iterator itself. Either way the dispatcher stream is closed, which cancels the request
on both tiers exactly as a gRPC cancel does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pdserve.core.sampling_params import DEFAULT_TENANT
from pdserve.router import metrics
from pdserve.router.admission import Admission, is_finished, usage
from pdserve.router.clock import Deadline, RequestClock
from pdserve.router.errors import to_status
from pdserve.router.http.errors import api_error
from pdserve.router.http.responses import Answer, Body, Completion, Endpoint, finish_reason
from pdserve.router.samples import clocks_for, gather_all, interleave, sample_requests
from pdserve.router.validation import ValidatedRequest
from pdserve.v1 import common_pb2, decode_pb2, generation_pb2

T = TypeVar("T")
_DONE = "data: [DONE]\n\n"
_CLIENT_CLOSED = 499


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


@dataclass(frozen=True)
class Call:
    """One admitted-to-be OpenAI request, already in the router's own request shape."""

    admission: Admission
    endpoint: Endpoint
    model: str
    request: generation_pb2.GenerateRequest
    params: Mapping[str, str]  # validator field -> the client's parameter name, where they differ
    # OpenAI's API sends none: the router's --http-request-timeout-seconds from the arrival.
    deadline: Deadline
    include_usage: bool = False
    tenant: str = DEFAULT_TENANT  # from its headers (router/tenants.py)


async def answer(http: Request, call: Call, stream: bool) -> Response:
    try:
        if not stream:
            return JSONResponse(await until_disconnect(http, _whole(call)))
        events = _events(call)
        first = await until_disconnect(http, anext(events))
    except ClientDisconnected:
        return Response(status_code=_CLIENT_CLOSED)
    except Exception as error:
        return api_error(error, call.params).response()
    return StreamingResponse(_prepend(first, events), media_type="text/event-stream")


async def until_disconnect(http: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientDisconnected after cancelling it (and waiting for its cleanup)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
    if task.cancelled():
        raise ClientDisconnected
    return task.result()


async def _disconnected(http: Request) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _whole(call: Call) -> Body:
    clock = RequestClock()
    with _counted(call.endpoint):
        async with call.admission.admitted(call.request, call.tenant) as valid:
            samples = sample_requests(valid)
            clocks = clocks_for(samples, clock)
            calls = [_collect(call, s, c) for s, c in zip(samples, clocks, strict=True)]
            completions = await gather_all(calls)
            return Answer(call.endpoint, valid.client_request_id, call.model).whole(completions)


async def _collect(call: Call, sample: ValidatedRequest, clock: RequestClock) -> Completion:
    """One sample's deltas gathered into its whole answer."""
    deltas = call.admission.deltas(sample, call.deadline, clock)
    texts: list[str] = []
    last = decode_pb2.TokenDelta()
    async with contextlib.aclosing(deltas):
        async for last in deltas:
            texts.append(last.text)
    return Completion("".join(texts), finish_reason(last.finish_reason), usage(sample, last, clock))


async def _events(call: Call) -> AsyncGenerator[str, None]:
    """SSE events ending in `[DONE]`; a failure after the first event becomes an error event.
    With n > 1 the samples' events interleave as they come, each choice carrying its index."""
    clock = RequestClock()
    started: set[int] = set()
    try:
        with _counted(call.endpoint):
            async with call.admission.admitted(call.request, call.tenant) as valid:
                reply = Answer(call.endpoint, valid.client_request_id, call.model)
                samples = sample_requests(valid)
                clocks = clocks_for(samples, clock)
                usages: list[common_pb2.Usage] = []
                streams = [
                    call.admission.deltas(s, call.deadline, c)
                    for s, c in zip(samples, clocks, strict=True)
                ]
                async with contextlib.aclosing(interleave(streams)) as deltas:
                    async for index, delta in deltas:
                        reason = finish_reason(delta.finish_reason)
                        first = index not in started
                        started.add(index)
                        yield _event(reply.chunk(index, delta.text, reason, first))
                        if is_finished(delta):
                            usages.append(usage(samples[index], delta, clocks[index]))
                if call.include_usage:
                    yield _event(reply.usage_chunk(usages))
    except Exception as error:
        if not started:
            raise
        yield _event(api_error(error, call.params).body())
    yield _DONE


async def _prepend(first: str, events: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    async with contextlib.aclosing(events):
        yield first
        async for event in events:
            yield event


def _event(body: Body) -> str:
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


@contextlib.contextmanager
def _counted(endpoint: Endpoint) -> Iterator[None]:
    """Counts the call in pdserve_router_requests by path and gRPC code, as the gRPC door does."""
    code = grpc.StatusCode.OK
    try:
        yield
    except (asyncio.CancelledError, GeneratorExit):
        code = grpc.StatusCode.CANCELLED
        raise
    except Exception as error:
        code = to_status(error)[0]
        raise
    finally:
        metrics.REQUESTS.labels(endpoint.value, code.name).inc()
