"""One request through the tiers: where to prefill it, the decode stream, and migration.

    placement (placement/) ──local──> Decode.GenerateLocal on the least-loaded decode worker
              └──remote──> Reserve + Prefill (remote_prefill.py) -> Decode.Generate
    --placement adaptive (placement/adaptive.py) chooses the workers too: local on a decode
        worker or on a prefill worker it lends streams (placement/roles.py), or remote from a given
        prefill worker to a given decode worker
    token deltas to the caller
    decode worker lost mid-stream (UNAVAILABLE) ──> migrate: a new run on another decode worker
        (placed by the same rule) gets the prompt and, as its resumed output, every token
        already streamed; it computes their KV and continues the stream, none repeated or
        skipped. Output equals the undisturbed run's: greedy and seeded tokens (the continuation
        recomputes exactly that context; the seeded sampler skips the resumed tokens' noise),
        text and stop strings (its detokenizer has seen the resumed tokens, so text the lost
        worker held back comes out, and a stop string may span the failure point), usage.
    decode worker draining (its deltas say so) ──> live migration (live_migration.py): the
        stream is suspended there and its KV pushed to another decode worker, which continues
        it; no re-prefill. If that fails, the request is re-prefilled as after a lost worker.

On any way out that is not a finished stream (error, client cancel, deadline, a lost worker), the
in-flight downstream call is cancelled and decode is told to abort in the background, so no tier
keeps blocks for a request nobody waits for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from typing import TYPE_CHECKING

import grpc

from pdserve.costmodel.output_length import OutputLengths
from pdserve.router import metrics
from pdserve.router.aborts import Aborts
from pdserve.router.clock import Deadline, RequestClock
from pdserve.router.config import RelayMode, RouterConfig
from pdserve.router.decode_mux import DecodeMultiplexer, MuxRun
from pdserve.router.direct_calls import DirectCalls, DirectRun
from pdserve.router.errors import RouterError
from pdserve.router.live_migration import LiveMigration, StreamSuspended
from pdserve.router.placement.adaptive import AdaptiveChoice, place_adaptive
from pdserve.router.placement.arrival_rate import ArrivalRate
from pdserve.router.placement.prefill_place import (
    PlacementMode,
    PrefillPlace,
    PrefillTierState,
    place_prefill,
)
from pdserve.router.placement.roles import Roles
from pdserve.router.registry import Registry
from pdserve.router.remote_prefill import Chosen, RemotePrefill
from pdserve.router.slo_admission import Slo, SloGate, ttft_as_seen
from pdserve.router.validation import ValidatedRequest
from pdserve.router.worker import Worker
from pdserve.v1 import common_pb2, decode_pb2

if TYPE_CHECKING:
    from pdserve.v1.decode_pb2_grpc import DecodeAsyncStub

# A request's deltas from decode: its own call (--relay per-request), or its share of the
# worker's Multiplex stream; both iterate deltas, raise AioRpcError, and cancel().
DecodeRun = DirectRun | MuxRun
StartCall = Callable[[], DecodeRun]
# Finishes that say how long a stream runs (an abort says nothing of it).
ENDED_BY_ITSELF = frozenset({common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH})

__all__ = ["Deadline", "Dispatcher"]

log = logging.getLogger(__name__)


class WorkerLostError(Exception):
    """A decode worker's stream broke: the process died, or the connection to it did."""

    def __init__(self, address: str, cause: grpc.aio.AioRpcError) -> None:
        super().__init__(f"decode worker {address}: {cause.code().name}: {cause.details()}")
        self.address = address
        self.cause = cause


class Dispatcher:
    def __init__(self, registry: Registry, config: RouterConfig) -> None:
        self.registry = registry
        self.config = config
        self.aborts = Aborts(registry, config)
        self.remote = RemotePrefill(registry, config, self.aborts)
        self.roles = Roles(registry)
        self.live = LiveMigration(registry, self.aborts)
        self.multiplexer = DecodeMultiplexer()
        self.direct = DirectCalls()
        registry.decode.on_lost = self._lose  # a wedged or silent worker's streams move
        # How long streams ran (those that ended by themselves): adaptive placement prices a
        # request's decode by the forecast, not by its max_tokens alone.
        self.output_lengths = OutputLengths()
        # Requests placed a second: adaptive placement prices those expected to arrive.
        self.arrivals = ArrivalRate()
        defaults = Slo(config.slo_ttft_seconds, config.slo_tpot_seconds)
        self.gate = SloGate(
            defaults,
            config.costs,
            self.roles.worker_states,
            self.output_lengths.remaining,
            lambda: self.arrivals.per_second(time.monotonic()),
        )

    @property
    def block_size(self) -> int:
        """The decode workers' KV block size, learned from their reservations (for Info)."""
        return self.remote.block_size

    async def stream(
        self, request: ValidatedRequest, deadline: Deadline, clock: RequestClock
    ) -> AsyncGenerator[decode_pb2.TokenDelta, None]:
        """The request's deltas; close it (aclosing) so a cancel runs its cleanup."""
        emitted: list[int] = []
        left: list[str] = []  # decode workers this request must not go back to (lost, drained)
        # Where the next run goes: a live migration's target, else wherever it is placed.
        target: tuple[Worker[DecodeAsyncStub], StartCall] | None = None
        while True:
            if target is None:
                run = _continued(request, emitted) if emitted else request
                if request.judged and not emitted and not left:  # its first placement
                    max_tokens = request.sampling.max_tokens
                    prediction = self.gate.check(request.context_length, max_tokens, request.slo)
                    clock.predicted_ttft = prediction.ttft_s if prediction else None
                target = await self._place(run, deadline, clock, avoid=left)
            try:
                finish = common_pb2.FINISH_REASON_UNSPECIFIED
                # Straight from the relay (no generator in between: each one costs every delta).
                async for delta in self._relay(*target, request.request_id):
                    emitted.extend(delta.token_ids)
                    finish = delta.finish_reason
                    yield delta
                if finish in ENDED_BY_ITSELF:
                    generated = len(request.resumed_output_token_ids) + len(emitted)
                    self.output_lengths.record(request.sampling.max_tokens, generated)
                return
            except WorkerLostError as failure:
                target = None
                left.append(failure.address)
                self._check_migratable(failure, left, len(emitted))
                metrics.MIGRATIONS.labels("migrated").inc()
                log.warning(
                    "request %s: %s after %d tokens; migrating",
                    request.log_name,
                    failure,
                    len(emitted),
                )
            except StreamSuspended as suspended:
                left.append(suspended.source.address)
                target = await self._move_live(request, emitted, suspended, deadline, left)

    async def _move_live(
        self,
        request: ValidatedRequest,
        emitted: list[int],
        suspended: StreamSuspended,
        deadline: Deadline,
        left: list[str],
    ) -> tuple[Worker[DecodeAsyncStub], StartCall] | None:
        """The worker and the call that continue a suspended stream, or None: re-prefill. The
        source's hold from its run lasts until the move is done: a draining worker already
        gone from DNS keeps its channel open for Migrate."""
        try:
            moved = await self.live.move(request, emitted, suspended.source, deadline, left)
        finally:
            self.registry.decode.release(suspended.source)
        if moved is None:
            metrics.MIGRATIONS.labels("migrated").inc()
            return None
        target, generate = moved
        return target, self._generate(target, generate, deadline)

    def _check_migratable(self, failure: WorkerLostError, lost: list[str], tokens: int) -> None:
        if len(lost) <= self.config.max_migrations and self.registry.decode.has_untried(lost):
            return
        metrics.MIGRATIONS.labels("failed").inc()
        raise RouterError(
            grpc.StatusCode.UNAVAILABLE,
            f"router: decode worker {failure.address} was lost after {tokens} tokens "
            f"({failure.cause.details()}); no other decode worker could take the request over",
        )

    async def _place(
        self,
        request: ValidatedRequest,
        deadline: Deadline,
        clock: RequestClock,
        avoid: Collection[str],
    ) -> tuple[Worker[DecodeAsyncStub], StartCall]:
        """One run's decode worker (one `acquire` held for `_relay`) and the call that starts
        it there, prefilled where the placement says."""
        if self.config.placement_mode is PlacementMode.ADAPTIVE:
            return await self._adaptive(request, deadline, clock, avoid)
        return await self._threshold(request, deadline, clock, avoid)

    async def _threshold(
        self,
        request: ValidatedRequest,
        deadline: Deadline,
        clock: RequestClock,
        avoid: Collection[str],
    ) -> tuple[Worker[DecodeAsyncStub], StartCall]:
        prefill = self.registry.prefill
        tier = PrefillTierState(prefill.healthy_count(), prefill.in_flight())
        placement = place_prefill(
            request.context_length,
            self.config.disagg_threshold,
            self.config.max_prefill_queue,
            tier,
        )
        metrics.PREFILL_PLACEMENTS.labels(placement.place.value, placement.reason.value).inc()
        if placement.place is PrefillPlace.LOCAL:
            decode = self.registry.decode.pick(avoid=avoid, prompt=request.prompt_token_ids)
            return await self._local(request, deadline, clock, decode)
        return await self._remote(request, deadline, clock, avoid)

    async def _adaptive(
        self,
        request: ValidatedRequest,
        deadline: Deadline,
        clock: RequestClock,
        avoid: Collection[str],
    ) -> tuple[Worker[DecodeAsyncStub], StartCall]:
        """The cost model's choice of workers (placement/adaptive.py)."""
        costs = self.config.costs
        assert costs is not None  # RouterConfig refuses --placement adaptive without a profile
        self.roles.take_back_idle()
        prompt_tokens = request.context_length  # a migration recomputes its resumed output too
        resumed = len(request.resumed_output_token_ids)
        output_tokens = self.output_lengths.remaining(request.sampling.max_tokens, resumed)
        states = self.roles.worker_states(avoid)
        now = time.monotonic()
        choice = place_adaptive(
            prompt_tokens, output_tokens, states, costs, self.arrivals.per_second(now)
        )
        self.arrivals.record(now)
        placement, option = choice.placement, choice.option
        if clock.first_token is None:  # as admission predicts it
            clock.predicted_ttft = ttft_as_seen(option, costs)
        metrics.PREFILL_PLACEMENTS.labels(placement.place.value, placement.reason.value).inc()
        _log_placement(request, output_tokens, choice)
        if option.prefill is None:
            decode = self.roles.decode_worker(option.decode.address)
            decode.sent_prompts.decided(request.request_id, prompt_tokens)
            try:
                return await self._local(request, deadline, clock, decode)
            except BaseException:  # never sent: nothing would clear its count
                decode.sent_prompts.forget(request.request_id)
                raise
        chosen = (
            self.registry.decode.workers[option.decode.address],
            self.registry.prefill.workers[option.prefill.address],
        )
        chosen[1].sent_prompts.decided(request.request_id, prompt_tokens)
        try:
            return await self._remote(request, deadline, clock, avoid, chosen)
        finally:  # prefilled by now, or never sent there (a retry may have chosen another)
            chosen[1].sent_prompts.forget(request.request_id)

    async def _local(
        self,
        request: ValidatedRequest,
        deadline: Deadline,
        clock: RequestClock,
        decode: Worker[DecodeAsyncStub],
    ) -> tuple[Worker[DecodeAsyncStub], StartCall]:
        """Colocated: the decode worker prefills the prompt itself."""
        clock.place = PrefillPlace.LOCAL.value
        await self.aborts.settled(decode.address, request.request_id)
        self.registry.decode.acquire(decode)
        decode.sent_prompts.call_started(request.request_id)
        message = decode_pb2.GenerateLocalRequest(request=request.to_work())
        clock.on_prefill_sent()
        if self.config.relay is RelayMode.MULTIPLEXED:
            command = decode_pb2.MultiplexCommand(generate_local=message)
            return decode, self._multiplexed(decode, command, request.request_id, deadline)
        return decode, lambda: self.direct.start(
            decode, lambda: decode.stub.GenerateLocal(message, timeout=deadline.remaining())
        )

    async def _remote(
        self,
        request: ValidatedRequest,
        deadline: Deadline,
        clock: RequestClock,
        avoid: Collection[str],
        chosen: Chosen | None = None,
    ) -> tuple[Worker[DecodeAsyncStub], StartCall]:
        """Disaggregated: the prefill tier prefills it into a reservation on decode."""
        clock.place = PrefillPlace.REMOTE.value
        handoff = await self.remote.handoff(request, deadline, clock, avoid, chosen)
        message = decode_pb2.DecodeRequest(
            request_id=request.request_id,
            transfer_token=handoff.transfer_token,
            first_token_id=handoff.first_token_id,
        )
        return handoff.decode, self._generate(handoff.decode, message, deadline)

    def _generate(
        self, decode: Worker[DecodeAsyncStub], message: decode_pb2.DecodeRequest, deadline: Deadline
    ) -> StartCall:
        """Decode.Generate for a request whose KV is on `decode`, by the --relay path."""
        if self.config.relay is RelayMode.MULTIPLEXED:
            command = decode_pb2.MultiplexCommand(generate=message)
            return self._multiplexed(decode, command, message.request_id, deadline)
        return lambda: self.direct.start(
            decode, lambda: decode.stub.Generate(message, timeout=deadline.remaining())
        )

    def _lose(self, worker: Worker[DecodeAsyncStub]) -> None:
        """Fails every request on a wedged or silent decode worker over, on either relay."""
        self.multiplexer.lose(worker)
        self.direct.lose(worker)

    def _multiplexed(
        self,
        decode: Worker[DecodeAsyncStub],
        command: decode_pb2.MultiplexCommand,
        request_id: str,
        deadline: Deadline,
    ) -> StartCall:
        def start() -> MuxRun:
            deadline.remaining()  # DEADLINE_EXCEEDED before sending, as a call's timeout is
            return self.multiplexer.run(decode, command, request_id, deadline)

        return start

    async def _relay(
        self, decode: Worker[DecodeAsyncStub], start: StartCall, request_id: str
    ) -> AsyncIterator[decode_pb2.TokenDelta]:
        """Decode's deltas until finished. The caller holds one `acquire` on `decode`, which
        this releases; a run that does not finish is aborted there, except a suspended one,
        whose KV waits there for the live migration (StreamSuspended, which takes over the
        hold)."""
        finished = suspended = False
        call: DecodeRun | None = None
        suspending: asyncio.Task[None] | None = None
        try:
            call = start()
            async for delta in call:
                decode.heard_from()  # a busy worker late to answer Load is not a silent one
                if delta.suspended:
                    suspended = True
                    raise StreamSuspended(decode)
                if delta.draining and suspending is None and self.live.can_move(decode):
                    suspending = asyncio.create_task(self.live.suspend(decode, request_id))
                finished = _finished(delta)
                yield delta
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            self.registry.decode.mark_unhealthy(decode)
            raise WorkerLostError(decode.address, error) from error
        finally:
            if call is not None:
                call.cancel()
            if suspending is not None and not suspending.done():
                suspending.cancel()  # the stream ended first: nothing left to suspend
            if not suspended:
                if not finished:
                    self.aborts.later(decode, request_id)
                self.registry.decode.release(decode)

    async def wait_aborts(self) -> None:
        """Waits for the background Aborts sent so far (tests, shutdown)."""
        await self.aborts.wait_all()


def _finished(delta: decode_pb2.TokenDelta) -> bool:
    return bool(delta.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED)


def _continued(request: ValidatedRequest, emitted: list[int]) -> ValidatedRequest:
    """The rest of `request` after `emitted`: what a migration runs on another worker."""
    return dataclasses.replace(request, resumed_output_token_ids=tuple(emitted))


def _log_placement(request: ValidatedRequest, output_tokens: int, choice: AdaptiveChoice) -> None:
    """What the cost model chose and its prices (--log-level debug): why a request landed where
    it did, read beside its latencies."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    option = choice.option
    prefill = "" if option.prefill is None else f" prefill {option.prefill.address}"
    log.debug(
        "placed %s: %d prompt tokens, %d output expected: %s (%s) decode %s%s; predicted "
        "ttft %.3f s, stall %.3f s, decode %.3f s, blocked %.3f s, step %.4f s; decode worker had "
        "%d streams, %d prompt tokens queued",
        request.log_name,
        request.context_length,
        output_tokens,
        choice.placement.place.value,
        choice.placement.reason.value,
        option.decode.address,
        prefill,
        option.ttft_s,
        option.stall_s,
        option.decode_s,
        option.blocked_s,
        option.step_s,
        option.decode.running,
        option.decode.pending_prompt_tokens,
    )
