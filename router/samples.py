"""`sampling.n` > 1 at the router: one request per sample, through the normal dispatch path.

The router fans the n samples out as n ordinary requests (ids `<id>/<i>`, sample i seeded with
seed + i), so retries, migration, cancel and deadlines work per sample with no worker change, and
merges their answers. Why not fork on decode: the reply must then demultiplex one decode stream
into n, through the dispatcher and the decode engine; see docs/kv_sharing.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Coroutine, Sequence
from typing import Any, TypeVar

from pdserve.core.sampling_params import InvalidRequestError, sample_ids
from pdserve.core.serving.sampling_proto import sampling_from_proto, sampling_to_proto
from pdserve.router.clock import RequestClock
from pdserve.router.validation import ValidatedRequest
from pdserve.v1 import generation_pb2

MAX_SAMPLES = 16
T = TypeVar("T")


def stream_count(request: generation_pb2.GenerateRequest, max_queue: int) -> int:
    """How many streams the request runs (its samples): its places under --max-queue. Checked
    before anything else, as a request that can never fit is no reason to queue."""
    samples = request.sampling.n or 1  # proto3's zero: the default, one
    if samples > MAX_SAMPLES:
        raise InvalidRequestError("sampling.n", f"at most {MAX_SAMPLES}, got {samples}")
    if samples > max_queue:
        raise InvalidRequestError(
            "sampling.n", f"{samples} samples can never fit the router's --max-queue {max_queue}"
        )
    return int(samples)


def sample_requests(request: ValidatedRequest) -> list[ValidatedRequest]:
    """The request's samples as requests of one sample each (itself when n is 1); n was
    checked at admission (`stream_count`)."""
    params = sampling_from_proto(request.sampling, request.priority)
    return [
        dataclasses.replace(
            request,
            request_id=sample_id,
            sampling=sampling_to_proto(params.for_sample(index)),
            judged=index == 0,  # the request is admitted (or refused) once, by its first sample
        )
        for index, sample_id in enumerate(sample_ids(request.request_id, params.n))
    ]


def clocks_for(samples: list[ValidatedRequest], clock: RequestClock) -> list[RequestClock]:
    """One clock per sample, all starting at the call's arrival."""
    return [clock] + [RequestClock(arrival=clock.arrival) for _ in samples[1:]]


async def gather_all(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every call's result; the first failure cancels the others (their requests with them)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


def merge_responses(
    request_id: str, responses: list[generation_pb2.GenerateResponse]
) -> generation_pb2.GenerateResponse:
    """Sample 0's answer under the request's id, with every sample in `samples`."""
    if len(responses) == 1:
        return responses[0]
    merged = generation_pb2.GenerateResponse()
    merged.CopyFrom(responses[0])
    merged.request_id = request_id
    for index, response in enumerate(responses):
        merged.samples.add(
            index=index,
            token_ids=response.token_ids,
            text=response.text,
            finish_reason=response.finish_reason,
            usage=response.usage,
        )
    return merged


async def interleave(
    streams: Sequence[AsyncGenerator[T, None]],
) -> AsyncGenerator[tuple[int, T], None]:
    """Items of every stream as they come, tagged with the stream's index; the first error
    ends them all (each stream is closed, so its request is cancelled on the workers)."""
    queue: asyncio.Queue[tuple[int, T] | BaseException | None] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[T, None]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for item in stream:
                    await queue.put((index, item))
            await queue.put(None)
        except Exception as error:
            await queue.put(error)

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
