"""The router's one request path, shared by both doors (gRPC `Generation` and OpenAI HTTP).

    admitted(request, tenant)
                       --max-queue places, one per sample, shared among tenants by weight
                       (router/places.py: else RESOURCE_EXHAUSTED at once, or later if displaced
                       before its first token), validation (INVALID_ARGUMENT naming the field),
                       the tenant's rate limits (router/tenants.py), the router's own id
    deltas(...)        the dispatcher's token deltas; closing it early (aclosing) runs the
                       dispatcher's cleanup, which cancels the request on both tiers

A door turns its own request shape into a `GenerateRequest`, then calls these two in turn, so
limits, ids and cancellation behave the same whichever door a request came in by.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator

import grpc

from pdserve.core.sampling_params import DEFAULT_TENANT
from pdserve.router import metrics
from pdserve.router.clock import Deadline, RequestClock
from pdserve.router.config import RouterConfig
from pdserve.router.dispatch import Dispatcher
from pdserve.router.errors import RouterError
from pdserve.router.places import Holder, Places, Refused
from pdserve.router.samples import stream_count
from pdserve.router.tenants import TenantBuckets, TenantConfig
from pdserve.router.validation import RequestValidator, ValidatedRequest
from pdserve.v1 import common_pb2, decode_pb2, generation_pb2

_LOADING = "router: still loading the model's tokenizer"
# When a refused or displaced request may try again (its places may be free by then).
PLACES_RETRY_S = 1.0


class Admission:
    """Admission and validation for every public request."""

    def __init__(self, dispatcher: Dispatcher, config: RouterConfig) -> None:
        self.dispatcher = dispatcher
        self.config = config
        # None until the model's tokenizer and limits have loaded; calls before get UNAVAILABLE.
        self.validator: RequestValidator | None = None
        self.tenants: TenantConfig = config.tenants
        self.places = Places(config.max_queue, self.tenants.weight)
        self._buckets = TenantBuckets(self.tenants)

    @contextlib.asynccontextmanager
    async def admitted(
        self, request: generation_pb2.GenerateRequest, tenant: str = DEFAULT_TENANT
    ) -> AsyncIterator[ValidatedRequest]:
        """--max-queue places, one per stream the request runs (each of its samples), held
        until the call ends, and the validated request.

        Too few places means RESOURCE_EXHAUSTED at once (the router never queues unboundedly),
        as does a request past its tenant's rate limits; a request displaced before its first
        token (router/places.py) ends with RESOURCE_EXHAUSTED then.
        """
        holder = Holder(tenant, request.priority, stream_count(request, self.config.max_queue))
        task = asyncio.current_task()
        if task is not None:
            holder.on_displaced = task.cancel
        refused = self.places.take(holder)
        if refused is not None:
            self._count(tenant, refused.value)
            raise self._refusal(refused, holder)
        metrics.IN_FLIGHT.set(self.places.in_flight)
        try:
            valid = await self.loaded_validator().validate(request)
            self._charge(valid, tenant)
            self._count(tenant, "admitted")
            for _ in range(holder.streams):
                metrics.ADMITTED_PROMPT_TOKENS.observe(len(valid.prompt_token_ids))
            weight = self.tenants.weight(tenant)
            yield dataclasses.replace(valid, places=holder, tenant=tenant, tenant_weight=weight)
        except asyncio.CancelledError:
            if holder.displaced_by is None or task is None:
                raise
            task.uncancel()  # displaced: the call ends with its own answer, not a cancel
            self._count(tenant, Refused.DISPLACED.value)
            raise self._refusal(Refused.DISPLACED, holder) from None
        finally:
            self.places.release(holder)
            metrics.IN_FLIGHT.set(self.places.in_flight)

    def _charge(self, valid: ValidatedRequest, tenant: str) -> None:
        """Takes the request from its tenant's buckets (unlisted tenants share `default`'s),
        or refuses it with the wait its buckets need."""
        listed = tenant if tenant in self.tenants.tenants else DEFAULT_TENANT
        tokens = len(valid.prompt_token_ids) + valid.sampling.max_tokens
        wait = self._buckets.wait_for(listed, tokens)
        if wait > 0:
            self._count(tenant, "tenant_rate")
            raise RouterError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"router: tenant {tenant!r} is past its rate limits (--tenants); retry in "
                f"{wait:.1f} s",
                max(wait, 0.1),
            )

    def _refusal(self, refused: Refused, holder: Holder) -> RouterError:
        places = self.places
        why = {
            Refused.QUEUE_FULL: f"{places.in_flight} streams in flight of --max-queue "
            f"{places.capacity}, this request runs {holder.streams}",
            Refused.FAIR_SHARE: f"tenant {holder.tenant!r} holds {places.held_by(holder.tenant)} "
            f"places, its share is {places.share(holder.tenant):.0f} of {places.capacity}",
            Refused.DISPLACED: f"displaced before its first token by {holder.displaced_by}",
        }[refused]
        return RouterError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"router: {why} ({refused.value}); retry in {PLACES_RETRY_S:.0f} s",
            PLACES_RETRY_S,
        )

    def _count(self, tenant: str, outcome: str) -> None:
        known = tenant in self.tenants.tenants or tenant == DEFAULT_TENANT
        metrics.TENANT_REQUESTS.labels(tenant if known else "unlisted", outcome).inc()

    def loaded_validator(self) -> RequestValidator:
        if self.validator is None:
            raise RouterError(grpc.StatusCode.UNAVAILABLE, _LOADING)
        return self.validator

    async def deltas(
        self, request: ValidatedRequest, deadline: Deadline, clock: RequestClock
    ) -> AsyncGenerator[decode_pb2.TokenDelta, None]:
        """The request's token deltas, the last one with a finish reason (else INTERNAL)."""
        finished = False
        stream = self.dispatcher.stream(request, deadline, clock)
        async with contextlib.aclosing(stream) as deltas:
            async for delta in deltas:
                if request.places is not None:
                    request.places.started = True  # streamed: no longer displaceable
                clock.on_tokens(len(delta.token_ids))
                finished = is_finished(delta)
                if finished:
                    clock.on_finished(len(request.prompt_token_ids))
                yield delta
        if not finished:
            raise RouterError(
                grpc.StatusCode.INTERNAL, "router: decode stream ended without a finish reason"
            )


def is_finished(delta: decode_pb2.TokenDelta) -> bool:
    return bool(delta.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED)


def usage(
    request: ValidatedRequest, delta: decode_pb2.TokenDelta, clock: RequestClock
) -> common_pb2.Usage:
    """Decode's counts (it sends them on the last delta); the router's own as a fallback."""
    if delta.HasField("usage"):
        return delta.usage
    return common_pb2.Usage(
        prompt_tokens=len(request.prompt_token_ids), completion_tokens=clock.num_tokens
    )
