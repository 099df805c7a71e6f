"""The router's end of `Decode.Multiplex`: one stream per decode worker for all its requests.

    run(worker, command)  registers the request's inbox, then writes the command on the worker's
                          stream (opened on first use, again after it ends)
    reader task           each DecodeStep (one per engine step, every request's new tokens) ->
                          each delta into its request's inbox
    MuxRun                what the dispatcher iterates, as it iterates a Generate call: the
                          request's deltas, the error its call would end with (AioRpcError:
                          the same codes, so retries, migration and to_status see no
                          difference), `cancel()`

Coalescing (docs/router.md): a request's consumer takes everything waiting in its inbox at once
and gets it as one delta, so a client (or a router core) that falls behind gets fuller messages
while one that keeps up gets each step's tokens as they come. Nothing is ever held back to wait
for more. A suspended or failed request's last delta is never merged with tokens before it (the
dispatcher must relay those first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import grpc

from pdserve.router.clock import Deadline
from pdserve.v1 import decode_pb2

if TYPE_CHECKING:
    from pdserve.router.worker import Worker
    from pdserve.v1.decode_pb2_grpc import DecodeAsyncStub

log = logging.getLogger(__name__)

MultiplexCall = grpc.aio.StreamStreamCall[decode_pb2.MultiplexCommand, decode_pb2.DecodeStep]
_CODES = {code.value[0]: code for code in grpc.StatusCode}


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a per-request call would have raised: the dispatcher handles both alike."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class _Inbox:
    """One request's deltas, received and not yet taken; then how its stream ended, if not
    by its own last delta."""

    __slots__ = ("error", "items", "waiter")

    def __init__(self) -> None:
        self.items: list[decode_pb2.TokenDelta] = []
        self.error: grpc.aio.AioRpcError | None = None
        self.waiter: asyncio.Future[None] | None = None

    def put(self, delta: decode_pb2.TokenDelta) -> None:
        self.items.append(delta)
        self._wake()

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        if self.error is None:
            self.error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> decode_pb2.TokenDelta:
        """The next delta: everything waiting, as one (items before the error, then it)."""
        while not self.items:
            if self.error is not None:
                raise self.error
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return _take_merged(self.items)


def _ends(delta: decode_pb2.TokenDelta) -> bool:
    """A request's suspended or failed end: relayed on its own, after the tokens before it."""
    return delta.suspended or delta.error_code != 0


def _take_merged(items: list[decode_pb2.TokenDelta]) -> decode_pb2.TokenDelta:
    """Removes and returns the first delta of `items`, merged with the token deltas after it."""
    first = items[0]
    count = 1
    if not _ends(first):
        while count < len(items) and not _ends(items[count]):
            count += 1
    if count == 1:
        del items[0]
        return first
    batch = items[:count]
    del items[:count]
    return merge(batch)


def merge(deltas: list[decode_pb2.TokenDelta]) -> decode_pb2.TokenDelta:
    """Consecutive token deltas of one request as one: their tokens and text in order, the last
    one's finish, usage, timings and `draining` (the worker's state now)."""
    last = deltas[-1]
    merged = decode_pb2.TokenDelta(
        request_id=last.request_id,
        token_ids=[token for delta in deltas for token in delta.token_ids],
        text="".join(delta.text for delta in deltas),
        finish_reason=last.finish_reason,
        draining=last.draining,
    )
    if last.HasField("usage"):
        merged.usage.CopyFrom(last.usage)
    if last.HasField("timings"):
        merged.timings.CopyFrom(last.timings)
    return merged


class MuxRun:
    """One request on a Multiplex stream, iterated (and cancelled) as a Generate call is."""

    def __init__(self, stream: _Stream, request_id: str, deadline: Deadline) -> None:
        self._stream = stream
        self._request_id = request_id
        self._inbox = stream.inboxes[request_id]
        self._done = False
        self._timer: asyncio.TimerHandle | None = None
        if deadline.at is not None:
            # One timer for the whole run (not one per wait): the call's own deadline.
            self._timer = asyncio.get_running_loop().call_at(_loop_time(deadline.at), self._expire)

    def _expire(self) -> None:
        self._inbox.fail(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def __aiter__(self) -> MuxRun:
        return self

    async def __anext__(self) -> decode_pb2.TokenDelta:
        if self._done:
            raise StopAsyncIteration
        try:
            delta = await self._inbox.take()
        except grpc.aio.AioRpcError:
            self._finish(cancel=True)  # its deadline: decode aborts it (a lost stream: no-op)
            raise
        if delta.error_code:
            self._finish(cancel=False)
            code = _CODES.get(delta.error_code, grpc.StatusCode.UNKNOWN)
            raise rpc_error(code, delta.error_message)
        if delta.suspended or delta.finish_reason:
            self._finish(cancel=False)
        return delta

    def cancel(self) -> None:
        """The caller stops waiting (client cancel, deadline, error): decode aborts the request,
        as when a Generate call is cancelled. A no-op once the request has ended."""
        if not self._done:
            self._finish(cancel=True)

    def _finish(self, cancel: bool) -> None:
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        self._stream.forget(self._request_id, cancel)


def _loop_time(monotonic_at: float) -> float:
    """A time.monotonic() instant on the event loop's clock (the same clock in CPython's
    default loop; converted anyway, so a loop with its own clock stays right)."""
    loop = asyncio.get_running_loop()
    return loop.time() + (monotonic_at - time.monotonic())


class _Stream:
    """One open Multiplex call and the requests on it."""

    def __init__(
        self, stub: DecodeAsyncStub, address: str, on_end: Callable[[_Stream], None]
    ) -> None:
        self.address = address
        self.inboxes: dict[str, _Inbox] = {}
        self.ended = False
        self._commands: asyncio.Queue[decode_pb2.MultiplexCommand] = asyncio.Queue()
        self._call: MultiplexCall = stub.Multiplex(self._outgoing())
        self._on_end = on_end
        self._lost: str | None = None  # why the router gave the worker up (lose)
        self._reader = asyncio.create_task(self._read())

    def lose(self, reason: str) -> None:
        """Gives the worker up (it answers, but moves nothing): the call is cancelled and every
        request on it fails UNAVAILABLE, which the dispatcher migrates."""
        self._lost = reason
        self._call.cancel()

    def start(self, command: decode_pb2.MultiplexCommand, request_id: str) -> None:
        self.inboxes[request_id] = _Inbox()
        self._commands.put_nowait(command)

    def forget(self, request_id: str, cancel: bool) -> None:
        if self.inboxes.pop(request_id, None) is not None and cancel and not self.ended:
            self._commands.put_nowait(decode_pb2.MultiplexCommand(cancel=request_id))

    async def _outgoing(self) -> AsyncIterator[decode_pb2.MultiplexCommand]:
        while True:
            yield await self._commands.get()

    async def _read(self) -> None:
        error = rpc_error(grpc.StatusCode.UNAVAILABLE, "decode worker ended the Multiplex stream")
        try:
            async for step in self._call:
                inboxes = self.inboxes
                for delta in step.deltas:
                    inbox = inboxes.get(delta.request_id)
                    if inbox is not None:  # else cancelled here meanwhile
                        inbox.put(delta)
        except grpc.aio.AioRpcError as failure:
            # Whatever its code (a worker fault's INTERNAL, an over-long message's
            # RESOURCE_EXHAUSTED), a broken stream is a lost worker for every request on it:
            # UNAVAILABLE, which the dispatcher migrates. A request's own error comes as its
            # delta instead, with its own code.
            error = rpc_error(
                grpc.StatusCode.UNAVAILABLE,
                f"Multiplex stream broke: {failure.code().name}: {failure.details()}",
            )
        except asyncio.CancelledError:
            if self._lost is None:
                error = rpc_error(grpc.StatusCode.CANCELLED, "router: Multiplex stream closed")
                raise
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, self._lost)  # our cancel, not a close
        finally:
            self.ended = True
            self._on_end(self)
            for inbox in self.inboxes.values():
                inbox.fail(error)
            if self.inboxes:
                log.warning("decode worker %s: Multiplex stream ended: %s", self.address, error)


class DecodeMultiplexer:
    """The router's Multiplex streams, one per decode worker (opened on first use)."""

    def __init__(self) -> None:
        self._streams: dict[Worker[DecodeAsyncStub], _Stream] = {}

    def run(
        self,
        worker: Worker[DecodeAsyncStub],
        command: decode_pb2.MultiplexCommand,
        request_id: str,
        deadline: Deadline,
    ) -> MuxRun:
        """Starts the request on `worker`'s stream; iterate the result for its deltas."""
        stream = self._streams.get(worker)
        if stream is None:
            stream = _Stream(worker.stub, worker.address, lambda ended: self._ended(worker, ended))
            self._streams[worker] = stream
        stream.start(command, request_id)
        return MuxRun(stream, request_id, deadline)

    def lose(self, worker: Worker[DecodeAsyncStub]) -> None:
        """Fails every request on `worker`'s stream over to other workers (a wedged engine)."""
        stream = self._streams.get(worker)
        if stream is not None:
            stream.lose(f"decode worker {worker.address}: engine wedged (one step too long)")

    def _ended(self, worker: Worker[DecodeAsyncStub], stream: _Stream) -> None:
        if self._streams.get(worker) is stream:
            del self._streams[worker]
