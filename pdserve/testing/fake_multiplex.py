"""The fake decode worker's Decode.Multiplex stream (fake_tiers.FakeDecode serves it).

Its engine makes one token for every request running on the stream per step, on its own clock
(`Knobs.step_seconds`; `delay_seconds` when set), as a real decode worker steps whether or not
the router has read the last step; what the steps made while the stream was sending goes out as
one message, as decode_service/multiplex.py sends it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from pdserve.v1 import common_pb2, decode_pb2

if TYPE_CHECKING:
    from pdserve.testing.fake_tiers import FakeDecode

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


def planned_deltas(
    first_token_id: int, work: common_pb2.WorkRequest, live_migration: bool = False
) -> list[decode_pb2.TokenDelta]:
    """A request's deltas, one token each: `first_token_id, 1, 2, ...` up to max_tokens. After a
    live migration the count goes on instead: `first_token_id` was streamed by the source (it
    comes with Generate), so the deltas are the positions after it."""
    resumed = len(work.resumed_output_token_ids)  # a migration's
    max_tokens = work.sampling.max_tokens or 16
    if live_migration:
        tokens, before = list(range(resumed + 1, max_tokens)), resumed + 1
    else:
        tokens, before = [first_token_id, *range(1, max_tokens - resumed)], resumed
    deltas = [
        decode_pb2.TokenDelta(request_id=work.request_id, token_ids=[token], text=f"<{token}>")
        for token in tokens
    ] or [decode_pb2.TokenDelta(request_id=work.request_id)]
    last = deltas[-1]
    last.finish_reason = common_pb2.FINISH_REASON_LENGTH
    last.usage.prompt_tokens = len(work.prompt_token_ids)
    last.usage.completion_tokens = before + len(tokens)
    last.timings.decode_seconds = 0.004
    return deltas


class FakeMultiplex:
    """One router's Multiplex stream on a FakeDecode: commands start and cancel runs; each engine
    step makes the next delta of every run (a start's error as that request's delta), and the
    stream sends what the steps made since its last message as one message. `lost_after_tokens`
    breaks the whole stream (with `lost_code`), as a killed or failing process does; a step takes
    `delay_seconds`, else `step_seconds` (Knobs)."""

    def __init__(self, decode: FakeDecode, context: Context) -> None:
        self.decode = decode
        self.context = context
        self.runs: dict[str, list[decode_pb2.TokenDelta]] = {}
        self.sent: dict[str, int] = {}  # tokens made per run
        self.made: list[decode_pb2.TokenDelta] = []  # made by steps (or failed starts), unsent
        self.lost = False  # a step reached lost_after_tokens: the stream breaks
        self.suspending: set[str] = set()  # runs whose next step ends them `suspended`
        self.starting: dict[str, asyncio.Task[None]] = {}  # local starts waiting out the delay
        self.wake = asyncio.Event()  # for the stream: a run started or a delta was made
        self.has_runs = asyncio.Event()  # for the engine
        self.taken = asyncio.Event()  # the stream took what was made

    async def serve(
        self, commands: AsyncIterator[decode_pb2.MultiplexCommand]
    ) -> AsyncIterator[decode_pb2.DecodeStep]:
        reader = asyncio.create_task(self._read(commands))
        engine = asyncio.create_task(self._engine())
        try:
            while True:
                if self.lost:
                    await self.context.abort(self.decode.knobs.lost_code, "fake: Stream removed")
                if self.made:
                    step = decode_pb2.DecodeStep(deltas=self.made)
                    self.made = []
                    self.taken.set()
                    yield step
                    continue
                if reader.done() and not self.runs and not self.starting:
                    reader.result()
                    return
                await self._wait(reader)
        finally:
            reader.cancel()
            engine.cancel()
            for task in self.starting.values():
                task.cancel()
            for request_id in self.runs:
                self.decode.cancelled.append(request_id)
                self.decode.reservations.pop(request_id, None)

    async def _wait(self, reader: asyncio.Task[None]) -> None:
        """Until a run starts, a delta is made, or the router ends its commands."""
        self.wake.clear()
        waking = asyncio.ensure_future(self.wake.wait())
        watched = [waking] if reader.done() else [waking, reader]
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        waking.cancel()

    async def _engine(self) -> None:
        """A step every step time while there are runs; with a step time of 0, a step once the
        stream has taken the last one."""
        while True:
            await self.has_runs.wait()
            knobs = self.decode.knobs
            pause = knobs.delay_seconds or knobs.step_seconds
            if pause == 0 and self.made:
                self.taken.clear()
                await self.taken.wait()
                continue
            self._step()
            self.wake.set()
            await asyncio.sleep(pause)

    def suspend(self, request_id: str) -> bool:
        """Whether the request runs here; if so its next step ends it `suspended`."""
        if request_id not in self.runs:
            return False
        self.suspending.add(request_id)
        return True

    def _step(self) -> None:
        knobs = self.decode.knobs
        for request_id, deltas in list(self.runs.items()):
            if request_id in self.suspending:
                self.suspending.discard(request_id)
                self.made.append(decode_pb2.TokenDelta(request_id=request_id, suspended=True))
                self._forget(request_id)
                continue
            index = self.sent[request_id]
            if index == knobs.lost_after_tokens:
                self.lost = True
                return
            delta = deltas[index]
            delta.draining = knobs.draining_after_tokens is not None and (
                index >= knobs.draining_after_tokens
            )
            self.made.append(delta)
            self.sent[request_id] = index + 1
            if index + 1 == len(deltas):
                self._forget(request_id)

    async def _read(self, commands: AsyncIterator[decode_pb2.MultiplexCommand]) -> None:
        async for command in commands:
            kind = command.WhichOneof("command")
            if kind == "cancel":
                self._cancel(command.cancel)
            elif kind == "generate":
                self._generate(command.generate)
            elif kind == "generate_local":
                local = command.generate_local
                task = asyncio.create_task(self._generate_local(local))
                self.starting[local.request.request_id] = task
                task.add_done_callback(functools.partial(self._started, local.request.request_id))

    def _started(self, request_id: str, task: asyncio.Task[None]) -> None:
        del self.starting[request_id]

    def _cancel(self, request_id: str) -> None:
        """As a cancelled Generate / GenerateLocal call."""
        starting = self.starting.get(request_id)
        if starting is not None:
            starting.cancel()
        elif request_id in self.runs:
            self._forget(request_id)
        else:
            return
        self.decode.cancelled.append(request_id)

    def _generate(self, request: decode_pb2.DecodeRequest) -> None:
        reservation = self.decode.reservations.get(request.request_id)
        if reservation is None or reservation.token != request.transfer_token:
            self._fail(
                request.request_id, grpc.StatusCode.NOT_FOUND, "request_id: no such reservation"
            )
            return
        reserved = reservation.request
        deltas = planned_deltas(request.first_token_id, reserved.request, reserved.live_migration)
        self._run(request.request_id, deltas)

    async def _generate_local(self, request: decode_pb2.GenerateLocalRequest) -> None:
        """As GenerateLocal: the knobs' failures and delay come before its first token."""
        self.decode.local_requests.append(request)
        knobs = self.decode.knobs
        if knobs.failures:
            failure = knobs.failures.pop(0)
            self._fail(request.request.request_id, failure.code, failure.message)
            return
        if knobs.delay_seconds:
            await asyncio.sleep(knobs.delay_seconds)
        self._run(request.request.request_id, planned_deltas(0, request.request))

    def _run(self, request_id: str, deltas: list[decode_pb2.TokenDelta]) -> None:
        self.runs[request_id] = deltas
        self.sent[request_id] = 0
        self.has_runs.set()
        self.wake.set()

    def _fail(self, request_id: str, code: grpc.StatusCode, message: str) -> None:
        delta = decode_pb2.TokenDelta(
            request_id=request_id, error_code=code.value[0], error_message=message
        )
        self.made.append(delta)
        self.wake.set()

    def _forget(self, request_id: str) -> None:
        del self.runs[request_id], self.sent[request_id]
        self.decode.reservations.pop(request_id, None)
        if not self.runs:
            self.has_runs.clear()
