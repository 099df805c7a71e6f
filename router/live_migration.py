"""Live migration: a draining decode worker's stream moves to another worker with its KV.

    delta with `draining` ──> Suspend(source): the stream ends `suspended`, every token sent
    Reserve(target, prompt, resumed = streamed[:-1], live_migration) -> where the KV goes
    Migrate(source, that descriptor): the source pushes the KV over UCX and frees it
    Generate(target, first_token_id = streamed[-1]) -> the stream goes on from the next token

No prompt is prefilled again and no token is recomputed: the target continues with the KV the
source computed, its seeded sampler skipping the draws of the streamed tokens and its
detokenizer having seen them (text the source held back comes out there). Any failure (no other
worker with room, a transfer that fails, a source that freed the KV because it was not all on
the device) aborts the request on both sides and returns None: the caller then re-prefills it
elsewhere, as after a lost worker.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from pdserve.router import metrics
from pdserve.router.aborts import Aborts
from pdserve.router.clock import Deadline
from pdserve.router.registry import NoHealthyWorkerError, Registry
from pdserve.router.validation import ValidatedRequest
from pdserve.router.worker import Worker
from pdserve.v1 import decode_pb2

if TYPE_CHECKING:
    from pdserve.v1.decode_pb2_grpc import DecodeAsyncStub

log = logging.getLogger(__name__)

DecodeCall = grpc.aio.UnaryStreamCall[Any, decode_pb2.TokenDelta]
SUSPEND_TIMEOUT_S = 10.0


class StreamSuspended(Exception):
    """The source suspended the stream (Decode.Suspend): its KV waits there for Migrate."""

    def __init__(self, source: Worker[DecodeAsyncStub]) -> None:
        super().__init__(f"decode worker {source.address} suspended the stream")
        self.source = source


class LiveMigration:
    def __init__(self, registry: Registry, aborts: Aborts) -> None:
        self.registry = registry
        self.aborts = aborts

    def can_move(self, source: Worker[DecodeAsyncStub]) -> bool:
        """Whether another decode worker might take the stream (else it finishes on `source`,
        within its drain grace)."""
        # Own decode workers only: a move picks those (a lent prefill worker cannot take KV).
        return self.registry.decode.has_untried([source.address], own=True)

    async def suspend(self, source: Worker[DecodeAsyncStub], request_id: str) -> None:
        """Asks `source` to suspend the request; a failure leaves the stream running there."""
        message = decode_pb2.SuspendRequest(request_id=request_id)
        try:
            await source.stub.Suspend(message, timeout=SUSPEND_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            log.info("request %s: not suspended on %s: %s", request_id, source.address, error)

    async def move(
        self,
        request: ValidatedRequest,
        streamed: Sequence[int],
        source: Worker[DecodeAsyncStub],
        deadline: Deadline,
        avoid: Collection[str],
    ) -> tuple[Worker[DecodeAsyncStub], decode_pb2.DecodeRequest] | None:
        """Moves the suspended request's KV to another decode worker: that worker (one
        `acquire` held for the caller) and the Generate that continues the stream there; None
        when it could not (both sides aborted)."""
        request_id = request.request_id
        pool = self.registry.decode
        try:
            target = pool.pick(avoid=avoid, prompt=request.prompt_token_ids, own=True)
        except NoHealthyWorkerError:
            target = None
        if not streamed or target is None or target.address in avoid:  # pick's last resort
            log.info(
                "request %s: no other decode worker can take it; re-prefilling", request.log_name
            )
            self.aborts.later(source, request_id)
            return None
        pool.acquire(target)
        moved = False
        try:
            await self.aborts.settled(target.address, request_id)
            descriptor = await target.stub.Reserve(
                _reservation(request, streamed), timeout=deadline.remaining()
            )
            migrate = decode_pb2.MigrateRequest(request_id=request_id, destination=descriptor)
            await source.stub.Migrate(migrate, timeout=deadline.remaining())
            moved = True
        except grpc.aio.AioRpcError as error:
            log.warning(
                "request %s: live migration failed (%s); re-prefilling", request.log_name, error
            )
            return None
        finally:
            if not moved:  # also on a cancel: neither side keeps blocks for it
                self.aborts.later(target, request_id)
                self.aborts.later(source, request_id)
                pool.release(target)
        metrics.MIGRATIONS.labels("live").inc()
        generate = decode_pb2.DecodeRequest(
            request_id=request_id,
            transfer_token=descriptor.transfer_token,
            first_token_id=streamed[-1],
        )
        return target, generate


def _reservation(request: ValidatedRequest, streamed: Sequence[int]) -> decode_pb2.ReserveRequest:
    """KV for the prompt and every streamed token but the last, which comes with Generate."""
    return decode_pb2.ReserveRequest(request=request.to_work(streamed[:-1]), live_migration=True)
