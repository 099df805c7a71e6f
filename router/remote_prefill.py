"""The disaggregated hand-off: Reserve on decode, then Prefill on the prefill tier.

    pick decode -> Reserve ──fail(UNAVAILABLE | RESOURCE_EXHAUSTED)──> retry on another decode
                     │
    pick prefill -> Prefill ──fail(UNAVAILABLE | INTERNAL)──> Abort reservation, retry all
                     │                                        (prefer untried workers; when
                     │                                        the decode worker is gone, the
                     │                                        prefill worker stays healthy)
    hand-off: the prompt KV is in the decode worker's reserved blocks

    decode worker leaves (drains) while the prompt waits in the prefill queue
        -> Reserve on another, Prefill.Redirect there, Abort the first reservation
           (the prompt keeps its place in the queue; too late once its KV began to leave:
           the leaving worker then takes it and moves the stream live)

Without the redirect, scaling decode in under load lost requests: the worker that left held
reservations whose prompts waited longer in the prefill queue than its drain grace, and then
went (9 lost in the first `bench autoscale` run at half-core pods). Every call gets the time
left before the client's deadline as its timeout. A failure or cancel
after Reserve aborts the reservation in the background (`Aborts`), and so does a Reserve cut short
on its way (cancelled, expired, its connection broken): decode may have granted it with the
answer in flight.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from pdserve.router import metrics
from pdserve.router.aborts import Aborts
from pdserve.router.clock import Deadline, RequestClock
from pdserve.router.config import RouterConfig, Tier
from pdserve.router.decode_mux import rpc_error
from pdserve.router.registry import Registry
from pdserve.router.validation import ValidatedRequest
from pdserve.router.worker import Worker
from pdserve.v1 import common_pb2, decode_pb2, prefill_pb2

if TYPE_CHECKING:
    from pdserve.v1.decode_pb2_grpc import DecodeAsyncStub
    from pdserve.v1.prefill_pb2_grpc import PrefillAsyncStub

log = logging.getLogger(__name__)

_RETRY_RESERVE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
# A Reserve that failed on its way (deadline, cancel, a broken connection) rather than being
# refused by decode: decode may hold the reservation, its answer lost in flight.
_RESERVE_CUT_SHORT = frozenset(
    {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE}
)
# Failures before hand-off that another prefill worker may not repeat (a dead process gives
# UNAVAILABLE to its in-flight calls).
_RETRY_PREFILL = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL})
# How often a Prefill in flight checks whether its decode worker was lost meanwhile.
LOST_CHECK_S = 0.5


def _lost(worker: Worker[DecodeAsyncStub]) -> bool:
    """Unhealthy for a broken connection or a silence, not for answering late (busy)."""
    return not worker.healthy and not worker.slow


class RetryableError(Exception):
    def __init__(self, tier: Tier, cause: grpc.aio.AioRpcError) -> None:
        super().__init__(f"{tier.value}: {cause.code().name}: {cause.details()}")
        self.tier = tier
        self.cause = cause


@dataclass
class Destination:
    """Where a prompt's KV goes: a decode worker's reservation, until a redirect moves it."""

    decode: Worker[DecodeAsyncStub]
    descriptor: common_pb2.TransferDescriptor


@dataclass(frozen=True)
class Handoff:
    """A request whose prompt KV sits in `decode`'s reserved blocks, ready for Generate. The
    caller owns one `hold` on `decode` and releases it when the request ends."""

    decode: Worker[DecodeAsyncStub]
    transfer_token: bytes
    first_token_id: int


# The adaptive placement's (decode, prefill) workers for the first attempt (retries pick anew).
Chosen = tuple["Worker[DecodeAsyncStub]", "Worker[PrefillAsyncStub]"]


class RemotePrefill:
    def __init__(self, registry: Registry, config: RouterConfig, aborts: Aborts) -> None:
        self.registry = registry
        self.config = config
        self.aborts = aborts
        # The decode workers' KV block size, learned from their reservations (for Info).
        self.block_size = config.block_size

    async def handoff(
        self,
        request: ValidatedRequest,
        deadline: Deadline,
        clock: RequestClock,
        avoid_decode: Collection[str] = (),
        chosen: Chosen | None = None,
    ) -> Handoff:
        """Reserve + Prefill with retries; `avoid_decode` are workers not to reserve on (lost);
        `chosen` the workers of the first attempt (else the least loaded)."""
        tried_decode: set[str] = set(avoid_decode)
        tried_prefill: set[str] = set()
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                first = chosen if attempt == 1 else None
                return await self._attempt(
                    request, deadline, clock, tried_decode, tried_prefill, first
                )
            except RetryableError as failure:
                if attempt == self.config.max_attempts:
                    raise failure.cause from None
                metrics.RETRIES.labels(failure.tier.value).inc()
                log.warning("request %s: retrying after %s", request.log_name, failure)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _attempt(
        self,
        request: ValidatedRequest,
        deadline: Deadline,
        clock: RequestClock,
        tried_decode: set[str],
        tried_prefill: set[str],
        chosen: Chosen | None,
    ) -> Handoff:
        pool = self.registry.decode
        decode = (
            chosen[0]
            if chosen is not None
            else pool.pick(avoid=tried_decode, prompt=request.prompt_token_ids, own=True)
        )
        tried_decode.add(decode.address)
        pool.acquire(decode)
        destination: Destination | None = None
        handed_off = False
        try:
            descriptor = await self._reserve(decode, request, deadline, tried_decode)
            self.block_size = descriptor.layout.block_size or self.block_size
            destination = Destination(decode, descriptor)
            try:
                prefill = None if chosen is None else chosen[1]
                result = await self._prefill(
                    request, destination, deadline, clock, tried_prefill, prefill, tried_decode
                )
            except BaseException:
                self.aborts.later(destination.decode, request.request_id)
                raise
            handed_off = True
            return Handoff(
                destination.decode, destination.descriptor.transfer_token, result.first_token_id
            )
        finally:
            if not handed_off:
                pool.release(decode if destination is None else destination.decode)

    async def _reserve(
        self,
        decode: Worker[DecodeAsyncStub],
        request: ValidatedRequest,
        deadline: Deadline,
        tried: Collection[str],
    ) -> common_pb2.TransferDescriptor:
        message = decode_pb2.ReserveRequest(request=request.to_work())
        await self.aborts.settled(decode.address, request.request_id)
        try:
            descriptor: common_pb2.TransferDescriptor = await decode.stub.Reserve(
                message, timeout=deadline.remaining()
            )
            return descriptor
        except asyncio.CancelledError:
            self.aborts.later(decode, request.request_id)  # granted, perhaps: free it
            raise
        except grpc.aio.AioRpcError as error:
            if error.code() in _RESERVE_CUT_SHORT:
                self.aborts.later(decode, request.request_id)
            pool = self.registry.decode
            # A draining worker refuses new reservations with UNAVAILABLE too, yet still holds
            # the ones whose prompts wait in the prefill queue: marked dead, those would be
            # prefilled again elsewhere, not redirected (its next Load says it drains).
            if error.code() == grpc.StatusCode.UNAVAILABLE and await self._is_gone(decode):
                pool.mark_unhealthy(decode)
            if error.code() in _RETRY_RESERVE and pool.has_untried(tried):
                raise RetryableError(Tier.DECODE, error) from error
            raise

    async def _prefill(
        self,
        request: ValidatedRequest,
        destination: Destination,
        deadline: Deadline,
        clock: RequestClock,
        tried: set[str],
        chosen: Worker[PrefillAsyncStub] | None,
        tried_decode: set[str],
    ) -> prefill_pb2.PrefillResult:
        pool = self.registry.prefill
        worker = chosen or pool.pick(avoid=tried, prompt=request.prompt_token_ids)
        tried.add(worker.address)
        message = prefill_pb2.PrefillRequest(
            request=request.to_work(), destination=destination.descriptor
        )
        pool.acquire(worker)
        worker.sent_prompts.call_started(request.request_id)
        try:
            clock.on_prefill_sent()
            call = worker.stub.Prefill(message, timeout=deadline.remaining())
            result = await self._following(
                call, worker, destination, request, deadline, tried_decode
            )
        except grpc.aio.AioRpcError as error:
            decode = destination.decode
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                if await self._is_gone(decode):  # the KV had nowhere to go: not prefill's fault
                    self.registry.decode.mark_unhealthy(decode)
                    raise RetryableError(Tier.DECODE, error) from error
                pool.mark_unhealthy(worker)
            if error.code() in _RETRY_PREFILL and pool.healthy_count() > 0:
                raise RetryableError(Tier.PREFILL, error) from error
            raise
        finally:
            pool.release(worker)
        clock.on_prefill_done(result.timings)
        return result

    async def _following(
        self,
        call: Awaitable[prefill_pb2.PrefillResult],
        prefill: Worker[PrefillAsyncStub],
        destination: Destination,
        request: ValidatedRequest,
        deadline: Deadline,
        tried_decode: set[str],
    ) -> prefill_pb2.PrefillResult:
        """The Prefill call's result. Meanwhile, if its decode worker leaves, the prompt's KV is
        redirected to another decode worker's reservation (once per leaving worker); if it is
        lost (dead, cut off, given up), the attempt starts over at once (RetryableError) rather
        than when the KV sender gives up on it (30 s: a killed pod held a prompt so)."""
        running = asyncio.ensure_future(call)
        redirected_off: set[str] = set()
        try:
            while True:
                decode = destination.decode
                leaving = asyncio.ensure_future(decode.leaving.wait())
                try:
                    await asyncio.wait(
                        {running, leaving}, timeout=LOST_CHECK_S, return_when=FIRST_COMPLETED
                    )
                finally:
                    leaving.cancel()
                if running.done():
                    return running.result()
                if _lost(decode):
                    lost = rpc_error(
                        grpc.StatusCode.UNAVAILABLE,
                        f"decode worker {decode.address} was lost before the prompt's KV came",
                    )
                    raise RetryableError(Tier.DECODE, lost)
                if decode.leaving.is_set() and decode.address not in redirected_off:
                    redirected_off.add(decode.address)
                    await self._redirect(prefill, destination, request, deadline, tried_decode)
        finally:
            running.cancel()  # a no-op once done; else the caller gave up: so does the call

    async def _redirect(
        self,
        prefill: Worker[PrefillAsyncStub],
        destination: Destination,
        request: ValidatedRequest,
        deadline: Deadline,
        tried_decode: set[str],
    ) -> bool:
        """Reserves on another decode worker and points the queued prompt's KV there; the
        first reservation is aborted. False, with nothing changed, if no other worker takes it
        or the prompt's KV has begun to leave already. A Redirect call that fails leaves where
        the KV goes unknown (the engine may have taken it, the answer lost): RetryableError,
        and the attempt starts over."""
        pool = self.registry.decode
        leaving = destination.decode
        if not pool.has_untried(tried_decode, own=True):
            metrics.REDIRECTS.labels("no_other_worker").inc()
            return False
        target = pool.pick(avoid=tried_decode, prompt=request.prompt_token_ids, own=True)
        tried_decode.add(target.address)
        pool.acquire(target)
        moved = False
        try:
            try:
                descriptor = await self._reserve(target, request, deadline, tried_decode)
            except (RetryableError, grpc.aio.AioRpcError) as failure:  # no reservation there
                log.warning(
                    "request %s: no redirect off %s: %s", request.log_name, leaving.address, failure
                )
                metrics.REDIRECTS.labels("too_late").inc()
                return False
            message = prefill_pb2.RedirectRequest(
                request_id=request.request_id, destination=descriptor
            )
            try:
                answer = await prefill.stub.Redirect(message, timeout=deadline.remaining())
            except grpc.aio.AioRpcError as error:
                raise RetryableError(Tier.DECODE, error) from error
            moved = answer.redirected
        finally:
            if not moved:
                self.aborts.later(target, request.request_id)
                pool.release(target)
        metrics.REDIRECTS.labels("redirected" if moved else "too_late").inc()
        if moved:
            self.aborts.later(leaving, request.request_id)
            pool.release(leaving)
            destination.decode, destination.descriptor = target, descriptor
        return moved

    async def _is_gone(self, decode: Worker[DecodeAsyncStub]) -> bool:
        """Whether `decode` refuses a Load now (a dead process). Then a Prefill's UNAVAILABLE
        was its KV transfer's (the prefill worker is as healthy as before), and a Reserve's was
        its death, not its drain."""
        try:
            await decode.stub.Load(
                common_pb2.LoadRequest(), timeout=self.config.load_timeout_seconds
            )
        except grpc.aio.AioRpcError as error:
            return error.code() == grpc.StatusCode.UNAVAILABLE
        return False
