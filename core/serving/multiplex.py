"""`Decode.Multiplex`: one stream per router carrying every request it runs here.

    router ──MultiplexCommand(generate | generate_local | cancel)──> this worker
    engine step ──StepGroup (engine thread)──> one list per step ──> one DecodeStep to the router

Per request it sends what Generate / GenerateLocal would stream (the same deltas, `draining`,
the `suspended` end, usage and timings on the last), and an error those calls would end with as a
delta with `error_code`. What differs is the cost: one message per engine step for all the
router's requests instead of one per request per token, so the router (Python, one core) relays
a GPU's steps without spending a gRPC message, a `sendmsg` and a generator hop on each token.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc

from pdserve.core.errors import RequestSuspended
from pdserve.core.outputs import TokenDelta
from pdserve.core.serving import stream_metrics as metrics
from pdserve.core.serving.grpc_errors import status_code_for
from pdserve.core.serving.proto_convert import finish_reason_to_proto
from pdserve.core.serving.request_start import RequestStart, StartTransferred, local_start
from pdserve.core.serving.tier_runtime import TierRuntime, abort_and_unsubscribe
from pdserve.v1 import common_pb2, decode_pb2

Item: TypeAlias = "tuple[str, TokenDelta | BaseException]"

log = logging.getLogger(__name__)

# Steps that queued up while the stream was sending go out together, up to this many deltas at
# once (a bound on one hand-over's work, not on its size)...
MAX_DELTAS_PER_MESSAGE = 16384
# ...in messages of at most this many bytes: the router refuses one over its --max-message-bytes
# (4 MiB by default) and that breaks the whole stream. A delta is usually under 100 bytes (the
# router's 32-hex-digit id, a step's token, its text), but its text has no bound of its own: a
# step that verified drafts, or text held back for a stop string and released at once.
MAX_MESSAGE_BYTES = 1 << 20


@dataclass
class _Run:
    """One request of the stream, as the asyncio side tracks it."""

    usage: common_pb2.Usage  # tokens counted before this run (prompt, a migration's resumed)
    movable: bool  # a decode worker's request: `draining` may move it
    started: float
    last: float
    streamed: int = 0


class _Group:
    """The stream's StepGroup: a step's items gathered on the engine thread, handed over once."""

    def __init__(self, outbox: asyncio.Queue[list[Item]]) -> None:
        self._outbox = outbox
        self._aio_loop = asyncio.get_running_loop()
        self._items: list[Item] = []

    def add(self, request_id: str, item: TokenDelta | BaseException) -> None:
        self._items.append((request_id, item))

    def flush(self) -> None:
        items, self._items = self._items, []
        if items:
            self._aio_loop.call_soon_threadsafe(self._outbox.put_nowait, items)


class MultiplexStream:
    """One router's Multiplex call on this worker."""

    def __init__(self, runtime: TierRuntime, start_transferred: StartTransferred) -> None:
        self.runtime = runtime
        self.start_transferred = start_transferred
        self.outbox: asyncio.Queue[list[Item]] = asyncio.Queue()
        self.group = _Group(self.outbox)
        self.runs: dict[str, _Run] = {}
        self._compiling: set[asyncio.Task[None]] = set()  # starts waiting for their grammar

    async def serve(
        self, commands: AsyncIterator[decode_pb2.MultiplexCommand]
    ) -> AsyncIterator[decode_pb2.DecodeStep]:
        reader = asyncio.create_task(self._read(commands))
        drained = asyncio.create_task(self.runtime.host.drained.wait())
        ends = (reader, drained)  # either one: no more starts, so the stream ends once idle
        try:
            while not (_any_done(ends) and not self.runs and self.outbox.empty()):
                items = await self._next_items(ends)
                for message in split_by_bytes(self._step(items), MAX_MESSAGE_BYTES):
                    yield message
            if reader.done():
                reader.result()  # a failed read ends the call with its error
        finally:
            reader.cancel()
            drained.cancel()
            for compiling in self._compiling:
                compiling.cancel()
            self._abort_all()

    async def _next_items(self, ends: tuple[asyncio.Task[Any], ...]) -> list[Item]:
        """What steps delivered (every list queued, as one), or nothing once the router's
        side has ended its commands or the worker has drained."""
        if self.outbox.empty() and not _any_done(ends):
            getter = asyncio.ensure_future(self.outbox.get())
            await asyncio.wait([getter, *ends], return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                return []
            items = getter.result()
        else:
            items = await self.outbox.get()
        while not self.outbox.empty() and len(items) < MAX_DELTAS_PER_MESSAGE:
            items = items + self.outbox.get_nowait()
        return items

    async def _read(self, commands: AsyncIterator[decode_pb2.MultiplexCommand]) -> None:
        async for command in commands:
            kind = command.WhichOneof("command")
            if kind == "cancel":
                self._cancel(command.cancel)
            elif kind == "generate":
                generate = command.generate
                prepare = functools.partial(self.start_transferred, self.runtime, generate)
                self._start(generate.request_id, prepare)
            elif kind == "generate_local":
                local = command.generate_local
                self._start(
                    local.request.request_id, functools.partial(local_start, self.runtime, local)
                )
        # The router half-closed: it will send nothing more, but its requests run to their end.

    def _start(self, request_id: str, prepare: Callable[[], RequestStart]) -> None:
        """Starts a request on the engine thread; an error comes back as its delta."""
        if request_id in self.runs:
            # The router's ids are unique on its stream, and an answer to this start would be
            # taken for the running request's (both carry its id): refused in the log only.
            log.error("Multiplex: request %s started again while it runs; ignored", request_id)
            return
        try:
            starting = prepare()
        except Exception as error:  # as the request's own call would have ended
            self.runs[request_id] = self._new_run(common_pb2.Usage(), movable=False)
            self.outbox.put_nowait([(request_id, error)])
            return
        self.runs[request_id] = self._new_run(starting.usage, starting.movable)
        if starting.structured is None:
            self._start_on_engine(request_id, starting)
            return
        # Compiled off the engine thread, and off this reader: the stream's other commands go
        # on while a grammar compiles.
        compiling = asyncio.create_task(self._compile_then_start(request_id, starting))
        self._compiling.add(compiling)
        compiling.add_done_callback(self._compiling.discard)

    async def _compile_then_start(self, request_id: str, starting: RequestStart) -> None:
        try:
            await self.runtime.compile_grammar(starting.structured)
        except Exception as error:  # as the request's own call would have ended
            if request_id in self.runs:
                self.outbox.put_nowait([(request_id, error)])
            return
        if request_id in self.runs:  # not cancelled meanwhile
            self._start_on_engine(request_id, starting)

    def _start_on_engine(self, request_id: str, starting: RequestStart) -> None:
        loop = self.runtime.engine_loop()
        group = self.group
        start = starting.start

        def start_and_join() -> None:
            # Joined only once the engine accepted it (engine thread, no step in between): a
            # refused start must not touch the delivery of a request it collided with.
            try:
                start()
            except Exception as error:
                group.add(request_id, error)
                group.flush()
                return
            loop.join(request_id, group)

        loop.call(start_and_join, starting.prompt_tokens)

    def _new_run(self, usage: common_pb2.Usage, movable: bool) -> _Run:
        now = time.monotonic()
        return _Run(usage=usage, movable=movable, started=now, last=now)

    def _cancel(self, request_id: str) -> None:
        """As a cancelled Generate call: the request is aborted and forgotten here."""
        if self.runs.pop(request_id, None) is not None:
            self._abort_on_engine(request_id)

    def _abort_all(self) -> None:
        for request_id in list(self.runs):
            self._abort_on_engine(request_id)
        self.runs.clear()

    def _abort_on_engine(self, request_id: str) -> None:
        loop = self.runtime.loop
        if loop is not None:
            loop.call(functools.partial(abort_and_unsubscribe, loop, request_id))

    def _step(self, items: list[Item]) -> decode_pb2.DecodeStep:
        """The items as one message; the tokens counted once for the whole step."""
        step = decode_pb2.DecodeStep()
        now = time.monotonic()
        draining = self.runtime.host.draining
        tokens = 0
        for request_id, item in items:
            run = self.runs.get(request_id)
            if run is None:
                continue  # cancelled meanwhile: the router no longer waits for it
            delta = step.deltas.add(request_id=request_id)
            if isinstance(item, BaseException):
                del self.runs[request_id]
                _describe_end(delta, item)
                continue
            tokens += self._fill(delta, run, item, now)
            delta.draining = run.movable and draining
            if item.finished:
                del self.runs[request_id]
        metrics.TOKENS.inc(tokens)
        return step

    def _fill(self, delta: decode_pb2.TokenDelta, run: _Run, item: TokenDelta, now: float) -> int:
        histogram = metrics.INTER_TOKEN_LATENCY if run.streamed else metrics.TIME_TO_FIRST_TOKEN
        histogram.observe(now - run.last)
        run.last = now
        count = len(item.new_token_ids)
        run.streamed += count
        delta.token_ids.extend(item.new_token_ids)
        delta.text = item.text
        if item.finish_reason is not None:
            delta.finish_reason = finish_reason_to_proto(item.finish_reason)
            delta.usage.prompt_tokens = run.usage.prompt_tokens
            delta.usage.completion_tokens = run.usage.completion_tokens + run.streamed
            delta.timings.decode_seconds = now - run.started
        return count


def _describe_end(delta: decode_pb2.TokenDelta, error: BaseException) -> None:
    """A request that ended with an error (or was suspended) as its last delta."""
    if isinstance(error, RequestSuspended):
        delta.suspended = True
        return
    code = status_code_for(error)
    if code is grpc.StatusCode.INTERNAL:
        log.error("internal error", exc_info=error)  # a bug: keep the traceback
    delta.error_code = code.value[0]
    delta.error_message = str(error) or type(error).__name__


def split_by_bytes(step: decode_pb2.DecodeStep, limit: int) -> Iterator[decode_pb2.DecodeStep]:
    """`step`'s deltas, in order, in messages of at most `limit` bytes each (a delta larger than
    that goes alone); none for a step without deltas."""
    if step.ByteSize() <= limit:
        if step.deltas:
            yield step
        return
    part, size = decode_pb2.DecodeStep(), 0
    for delta in step.deltas:
        cost = delta.ByteSize() + _FIELD_OVERHEAD
        if part.deltas and size + cost > limit:
            yield part
            part, size = decode_pb2.DecodeStep(), 0
        part.deltas.append(delta)
        size += cost
    yield part


# A repeated message field's tag (1 byte) and length prefix (up to 5 bytes) per delta.
_FIELD_OVERHEAD = 6


def _any_done(tasks: tuple[asyncio.Task[Any], ...]) -> bool:
    return any(task.done() for task in tasks)
