"""One request through both tiers: Reserve on decode, Prefill, then relay Decode.Generate.

    pick decode -> Reserve ──fail(UNAVAILABLE | RESOURCE_EXHAUSTED)──> retry on another decode
                     │
    pick prefill -> Prefill ──fail(UNAVAILABLE | INTERNAL)──> Abort reservation, retry all
                     │                                        (prefer untried workers)
    hand-off: the prompt KV is on the decode worker
                     │
    Decode.Generate ──> token deltas to the caller (no retry past here: tokens may be out)

Every downstream call gets the time left before the client's deadline as its timeout. On any way
out that is not a finished stream (error, client cancel, deadline), the in-flight downstream call
is cancelled and the decode reservation is aborted in the background (best effort, short timeout),
so neither tier keeps blocks for a request nobody waits for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from pdserve.router import metrics
from pdserve.router.clock import RequestClock
from pdserve.router.config import RouterConfig, Tier
from pdserve.router.errors import RouterError
from pdserve.router.registry import Registry, Worker
from pdserve.router.validation import ValidatedRequest
from pdserve.v1 import common_pb2, decode_pb2, prefill_pb2

if TYPE_CHECKING:
    from pdserve.v1.decode_pb2_grpc import DecodeAsyncStub

log = logging.getLogger(__name__)

_RETRY_RESERVE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
# Failures before hand-off that another prefill worker may not repeat (a dead process gives
# UNAVAILABLE to its in-flight calls).
_RETRY_PREFILL = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL})


@dataclass(frozen=True)
class Deadline:
    """The client's deadline as a time.monotonic() instant; None when the client set none."""

    at: float | None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        return cls(None if seconds is None else time.monotonic() + seconds)

    def remaining(self) -> float | None:
        """Seconds left, for a downstream timeout; DEADLINE_EXCEEDED once none are."""
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise RouterError(grpc.StatusCode.DEADLINE_EXCEEDED, "router: deadline exceeded")
        return left


class RetryableError(Exception):
    def __init__(self, tier: Tier, cause: grpc.aio.AioRpcError) -> None:
        super().__init__(f"{tier.value}: {cause.code().name}: {cause.details()}")
        self.tier = tier
        self.cause = cause


@dataclass(frozen=True)
class Handoff:
    """A request whose prompt KV sits in `decode`'s reserved blocks, ready for Generate."""

    decode: Worker[DecodeAsyncStub]
    transfer_token: bytes
    first_token_id: int


class Dispatcher:
    def __init__(self, registry: Registry, config: RouterConfig) -> None:
        self.registry = registry
        self.config = config
        # Background Aborts by request id: a new Reserve for the same id (a retry, or the
        # client trying again) waits for it, so the Abort cannot free the new reservation.
        self._aborts: dict[str, asyncio.Task[None]] = {}
        # The decode workers' KV block size, learned from their reservations (for Info).
        self.block_size = config.block_size

    async def stream(
        self, request: ValidatedRequest, deadline: Deadline, clock: RequestClock
    ) -> AsyncGenerator[decode_pb2.TokenDelta, None]:
        """The decode worker's deltas; close it (aclosing) so a cancel runs its cleanup."""
        handoff = await self._prefilled(request, deadline, clock)
        finished = False
        message = decode_pb2.DecodeRequest(
            request_id=request.request_id,
            transfer_token=handoff.transfer_token,
            first_token_id=handoff.first_token_id,
        )
        try:
            call = handoff.decode.stub.Generate(message, timeout=deadline.remaining())
            try:
                async for delta in call:
                    finished = delta.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED
                    yield delta
            finally:
                call.cancel()
        finally:
            if not finished:
                self.abort_later(handoff.decode, request.request_id)
            self.registry.decode.release(handoff.decode)

    async def _prefilled(
        self, request: ValidatedRequest, deadline: Deadline, clock: RequestClock
    ) -> Handoff:
        tried_decode: set[str] = set()
        tried_prefill: set[str] = set()
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                return await self._attempt(request, deadline, clock, tried_decode, tried_prefill)
            except RetryableError as failure:
                if attempt == self.config.max_attempts:
                    raise failure.cause from None
                metrics.RETRIES.labels(failure.tier.value).inc()
                log.warning("request %s: retrying after %s", request.request_id, failure)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _attempt(
        self,
        request: ValidatedRequest,
        deadline: Deadline,
        clock: RequestClock,
        tried_decode: set[str],
        tried_prefill: set[str],
    ) -> Handoff:
        pool = self.registry.decode
        decode = pool.pick(avoid=tried_decode)
        tried_decode.add(decode.address)
        pool.acquire(decode)
        handed_off = False
        try:
            descriptor = await self._reserve(decode, request, deadline, tried_decode)
            self.block_size = descriptor.layout.block_size or self.block_size
            try:
                result = await self._prefill(request, descriptor, deadline, clock, tried_prefill)
            except BaseException:
                self.abort_later(decode, request.request_id)
                raise
            handed_off = True
            return Handoff(decode, descriptor.transfer_token, result.first_token_id)
        finally:
            if not handed_off:
                pool.release(decode)

    async def _reserve(
        self,
        decode: Worker[DecodeAsyncStub],
        request: ValidatedRequest,
        deadline: Deadline,
        tried: Collection[str],
    ) -> common_pb2.TransferDescriptor:
        message = decode_pb2.ReserveRequest(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling=request.sampling,
            priority=request.priority,
        )
        await self._after_pending_abort(request.request_id)
        try:
            descriptor: common_pb2.TransferDescriptor = await decode.stub.Reserve(
                message, timeout=deadline.remaining()
            )
            return descriptor
        except grpc.aio.AioRpcError as error:
            pool = self.registry.decode
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                pool.mark_unhealthy(decode)
            if error.code() in _RETRY_RESERVE and pool.has_untried(tried):
                raise RetryableError(Tier.DECODE, error) from error
            raise

    async def _prefill(
        self,
        request: ValidatedRequest,
        destination: common_pb2.TransferDescriptor,
        deadline: Deadline,
        clock: RequestClock,
        tried: set[str],
    ) -> prefill_pb2.PrefillResult:
        pool = self.registry.prefill
        worker = pool.pick(avoid=tried)
        tried.add(worker.address)
        message = prefill_pb2.PrefillRequest(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling=request.sampling,
            priority=request.priority,
            destination=destination,
        )
        pool.acquire(worker)
        try:
            clock.on_prefill_sent()
            result: prefill_pb2.PrefillResult = await worker.stub.Prefill(
                message, timeout=deadline.remaining()
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                pool.mark_unhealthy(worker)
            if error.code() in _RETRY_PREFILL and pool.healthy_count() > 0:
                raise RetryableError(Tier.PREFILL, error) from error
            raise
        finally:
            pool.release(worker)
        clock.on_prefill_done(result.timings)
        return result

    def abort_later(self, decode: Worker[DecodeAsyncStub], request_id: str) -> None:
        """Decode.Abort in the background: the caller may itself be cancelled already."""
        self.registry.decode.hold(decode)
        task = asyncio.get_running_loop().create_task(self._abort(decode, request_id))
        self._aborts[request_id] = task
        task.add_done_callback(lambda _: self._forget_abort(request_id, task))

    def _forget_abort(self, request_id: str, task: asyncio.Task[None]) -> None:
        if self._aborts.get(request_id) is task:
            del self._aborts[request_id]

    async def _after_pending_abort(self, request_id: str) -> None:
        pending = self._aborts.get(request_id)
        if pending is not None:
            # shield: cancelling this request must not cancel the Abort it waits for.
            await asyncio.shield(pending)

    async def _abort(self, decode: Worker[DecodeAsyncStub], request_id: str) -> None:
        try:
            await decode.stub.Abort(
                decode_pb2.AbortRequest(request_id=request_id),
                timeout=self.config.abort_timeout_seconds,
            )
        except Exception as error:  # best effort: decode frees blocks of cancelled calls too
            log.warning("request %s: Abort on %s failed: %s", request_id, decode.address, error)
        finally:
            self.registry.decode.release(decode)

    async def wait_aborts(self) -> None:
        """Waits for the background Aborts sent so far (tests, shutdown)."""
        await asyncio.gather(*self._aborts.values(), return_exceptions=True)
