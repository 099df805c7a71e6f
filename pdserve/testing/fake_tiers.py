"""Fake prefill and decode tiers on real grpc.aio servers, for the router's tests and benchmark.

They follow the internal contract's shapes and codes (Reserve -> Prefill -> Generate, Abort,
Load) but do no model work: prefill answers FIRST_TOKEN_ID at once, decode streams
`FIRST_TOKEN_ID, 1, 2, ...` until max_tokens (Decode.Multiplex: fake_multiplex.py). Each records
what it was asked, so a test can check what the router sent (Aborts, cancels, prompts), and can
be told to fail or to stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import grpc

from pdserve.testing.fake_multiplex import FakeMultiplex, planned_deltas
from pdserve.v1 import common_pb2, decode_pb2, decode_pb2_grpc, prefill_pb2, prefill_pb2_grpc

FIRST_TOKEN_ID = 42
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


@dataclass(frozen=True)
class Failure:
    code: grpc.StatusCode
    message: str


@dataclass
class Knobs:
    """What a fake does; tests change these between calls."""

    delay_seconds: float = 0.0  # before answering Reserve / Prefill, or between tokens
    failures: list[Failure] = field(default_factory=list)  # answered to the next calls, in order
    load: common_pb2.LoadResponse = field(default_factory=common_pb2.LoadResponse)
    load_fails: bool = False  # Load answers UNAVAILABLE, as a dead process does
    load_delay_seconds: float = 0.0  # Load answers this late, as a busy process may
    # Reserve holds its reservation this long before its answer leaves (an answer in flight).
    reserve_answer_seconds: float = 0.0
    # A decode stream breaks (UNAVAILABLE, as from a killed process) after this many tokens.
    lost_after_tokens: int | None = None
    # The code a Multiplex stream breaks with there (a worker fault may end it with any code).
    lost_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    # Multiplex: one engine step's time when delay_seconds is 0. The fake's engine steps on its
    # own clock, whether or not the stream has sent the last step (a real engine does not wait
    # for the router): steps made while the stream was sending go out together, as decode's do.
    # A real step takes milliseconds; steps with no time at all would outrun a router relaying
    # them in the same event loop, and its coalescing would merge tokens a test expects one by
    # one. 0: a step only once the last one has been sent (paced by the router alone).
    step_seconds: float = 0.005
    # Live migration: from this many tokens on, each Multiplex delta says the worker drains (as
    # one that got SIGTERM: the router then suspends and moves the stream, live_migration.py).
    draining_after_tokens: int | None = None
    # Decode.Migrate (pushing a suspended request's KV) fails with this, after `migrate_seconds`.
    migrate_failure: Failure | None = None
    migrate_seconds: float = 0.0
    # Prefill.Redirect answers that the prompt's KV has begun to leave for its first destination.
    redirect_too_late: bool = False


# unused-ignore: the ignore is needed only while mypy cannot resolve pdserve.v1 (then Any).
class FakePrefill(prefill_pb2_grpc.PrefillServicer):  # type: ignore[misc, unused-ignore]
    def __init__(self) -> None:
        self.knobs = Knobs()
        self.calls: list[prefill_pb2.PrefillRequest] = []
        self.cancelled: list[str] = []
        self.time_remaining: list[float | None] = []  # each call's deadline, as received
        self.redirects: list[prefill_pb2.RedirectRequest] = []

    async def Prefill(
        self, request: prefill_pb2.PrefillRequest, context: Context
    ) -> prefill_pb2.PrefillResult:
        self.calls.append(request)
        self.time_remaining.append(context.time_remaining())
        await _fail_or_wait(self.knobs, context, self.cancelled, request.request.request_id)
        return prefill_pb2.PrefillResult(
            first_token_id=FIRST_TOKEN_ID,
            kv_bytes_sent=len(request.request.prompt_token_ids) * 1024,
            timings=prefill_pb2.PrefillTimings(
                queue_seconds=0.001, prefill_seconds=0.002, transfer_seconds=0.003
            ),
        )

    async def Redirect(
        self, request: prefill_pb2.RedirectRequest, context: Context
    ) -> prefill_pb2.RedirectResult:
        self.redirects.append(request)
        return prefill_pb2.RedirectResult(redirected=not self.knobs.redirect_too_late)

    async def Load(
        self, request: common_pb2.LoadRequest, context: Context
    ) -> common_pb2.LoadResponse:
        return await _load(self.knobs, context)


@dataclass(frozen=True)
class Reservation:
    token: bytes
    request: decode_pb2.ReserveRequest


# unused-ignore: as above.
class FakeDecode(decode_pb2_grpc.DecodeServicer):  # type: ignore[misc, unused-ignore]
    def __init__(self) -> None:
        self.knobs = Knobs()
        self.reservations: dict[str, Reservation] = {}
        self.reserves: list[decode_pb2.ReserveRequest] = []
        self.local_requests: list[decode_pb2.GenerateLocalRequest] = []
        self.aborts: list[str] = []
        self.cancelled: list[str] = []
        self.multiplex_calls = 0
        self.largest_step = 0  # the most deltas one Multiplex message carried
        self.streams: set[FakeMultiplex] = set()  # the Multiplex streams open now
        self.migrated: list[str] = []  # requests whose (fake) KV a Migrate pushed out

    async def Reserve(
        self, request: decode_pb2.ReserveRequest, context: Context
    ) -> common_pb2.TransferDescriptor:
        self.reserves.append(request)
        work = request.request
        await _fail_or_wait(self.knobs, context, self.cancelled, work.request_id)
        if work.request_id in self.reservations:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, "request_id: already reserved")
        token = secrets.token_bytes(16)
        self.reservations[work.request_id] = Reservation(token, request)
        await asyncio.sleep(self.knobs.reserve_answer_seconds)  # a cancel here keeps the blocks
        return common_pb2.TransferDescriptor(
            request_id=work.request_id,
            worker_address=b"fake-ucx-address",
            block_ids=list(range((len(work.prompt_token_ids) + 15) // 16)),
            layout=common_pb2.KVLayout(
                num_layers=2, num_kv_heads=1, head_dim=8, block_size=16, dtype="float32"
            ),
            transfer_token=token,
        )

    async def Generate(
        self, request: decode_pb2.DecodeRequest, context: Context
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        reservation = self.reservations.get(request.request_id)
        if reservation is None or reservation.token != request.transfer_token:
            await context.abort(grpc.StatusCode.NOT_FOUND, "request_id: no such reservation")
            return
        try:
            async for delta in self._deltas(request, reservation, context):
                yield delta
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise
        finally:
            self.reservations.pop(request.request_id, None)

    async def _deltas(
        self, request: decode_pb2.DecodeRequest, reservation: Reservation, context: Context
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        deltas = planned_deltas(request.first_token_id, reservation.request.request)
        for index, delta in enumerate(deltas):
            if index == self.knobs.lost_after_tokens:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "fake: Stream removed")
            if index > 0 and self.knobs.delay_seconds:
                await asyncio.sleep(self.knobs.delay_seconds)
            yield delta

    async def GenerateLocal(
        self, request: decode_pb2.GenerateLocalRequest, context: Context
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        """Prefills here: as Generate, with a first token of 0 (no prefill worker sampled it)."""
        self.local_requests.append(request)
        request_id = request.request.request_id
        await _fail_or_wait(self.knobs, context, self.cancelled, request_id)
        reserve = decode_pb2.ReserveRequest(request=request.request)
        start = decode_pb2.DecodeRequest(request_id=request_id, first_token_id=0)
        try:
            async for delta in self._deltas(start, Reservation(b"", reserve), context):
                yield delta
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise

    async def Multiplex(
        self, request_iterator: AsyncIterator[decode_pb2.MultiplexCommand], context: Context
    ) -> AsyncIterator[decode_pb2.DecodeStep]:
        self.multiplex_calls += 1
        stream = FakeMultiplex(self, context)
        self.streams.add(stream)
        try:
            async for step in stream.serve(request_iterator):
                self.largest_step = max(self.largest_step, len(step.deltas))
                yield step
        finally:
            self.streams.discard(stream)

    async def Release(
        self, request: decode_pb2.ReleaseRequest, context: Context
    ) -> decode_pb2.ReleaseResponse:
        released = self.reservations.pop(request.request_id, None) is not None
        return decode_pb2.ReleaseResponse(released=released)

    async def Abort(
        self, request: decode_pb2.AbortRequest, context: Context
    ) -> decode_pb2.AbortResponse:
        self.aborts.append(request.request_id)
        aborted = self.reservations.pop(request.request_id, None) is not None
        return decode_pb2.AbortResponse(aborted=aborted)

    async def Load(
        self, request: common_pb2.LoadRequest, context: Context
    ) -> common_pb2.LoadResponse:
        return await _load(self.knobs, context)

    async def Suspend(
        self, request: decode_pb2.SuspendRequest, context: Context
    ) -> decode_pb2.SuspendResponse:
        """Multiplex runs only: the run's next step ends it with a `suspended` delta."""
        if not any(stream.suspend(request.request_id) for stream in self.streams):
            await context.abort(grpc.StatusCode.NOT_FOUND, "request_id: not running here")
        return decode_pb2.SuspendResponse()

    async def Migrate(
        self, request: decode_pb2.MigrateRequest, context: Context
    ) -> decode_pb2.MigrateResponse:
        """Pushes nothing (no KV here) but keeps the contract: the destination must be a
        live-migration reservation; `migrate_seconds` and `migrate_failure` (Knobs) apply."""
        await asyncio.sleep(self.knobs.migrate_seconds)
        failure = self.knobs.migrate_failure
        if failure is not None:
            await context.abort(failure.code, failure.message)
        self.migrated.append(request.request_id)
        return decode_pb2.MigrateResponse()


async def _fail_or_wait(knobs: Knobs, context: Context, cancelled: list[str], key: str) -> None:
    if knobs.failures:
        failure = knobs.failures.pop(0)
        await context.abort(failure.code, failure.message)
    if knobs.delay_seconds:
        try:
            await asyncio.sleep(knobs.delay_seconds)
        except asyncio.CancelledError:
            cancelled.append(key)
            raise


async def _load(knobs: Knobs, context: Context) -> common_pb2.LoadResponse:
    if knobs.load_fails:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "fake: load fails")
    await asyncio.sleep(knobs.load_delay_seconds)
    return knobs.load


@dataclass
class FakeTiers:
    """Fake workers on 127.0.0.1, each on its own grpc.aio server in the running loop."""

    prefill: list[FakePrefill]
    decode: list[FakeDecode]
    prefill_addresses: list[str]
    decode_addresses: list[str]
    servers: list[grpc.aio.Server]
    # The Decode service each prefill worker serves too (streams the router lends it), sharing
    # that worker's knobs (one process, one load).
    lent: list[FakeDecode] = field(default_factory=list)


@contextlib.asynccontextmanager
async def fake_tiers(num_prefill: int = 1, num_decode: int = 1) -> AsyncIterator[FakeTiers]:
    tiers = FakeTiers([], [], [], [], [])
    try:
        for _ in range(num_prefill):
            prefill, lent = FakePrefill(), FakeDecode()
            lent.knobs = prefill.knobs
            address = await _serve(
                tiers,
                (prefill_pb2_grpc.add_PrefillServicer_to_server, prefill),
                (decode_pb2_grpc.add_DecodeServicer_to_server, lent),
            )
            tiers.prefill.append(prefill)
            tiers.lent.append(lent)
            tiers.prefill_addresses.append(address)
        for _ in range(num_decode):
            decode = FakeDecode()
            address = await _serve(tiers, (decode_pb2_grpc.add_DecodeServicer_to_server, decode))
            tiers.decode.append(decode)
            tiers.decode_addresses.append(address)
        yield tiers
    finally:
        await asyncio.gather(*(server.stop(None) for server in tiers.servers))


async def _serve(tiers: FakeTiers, *services: tuple[Any, Any]) -> str:
    server = grpc.aio.server()
    for add, servicer in services:
        add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tiers.servers.append(server)
    return f"127.0.0.1:{port}"
