"""Decode.Abort in the background, retried until it answers.

An abort is sent when a request ends any way but a finished stream (error, client cancel,
deadline, migration), so the decode worker frees what it holds for it. The caller may itself be
cancelled already, so the abort runs as its own task. A new Reserve for the same request id (a
retry, or the client trying again) waits for a pending abort first, so the abort cannot free the
new reservation.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc

from pdserve.router.config import RouterConfig
from pdserve.router.registry import Registry
from pdserve.router.worker import Worker
from pdserve.v1 import decode_pb2

if TYPE_CHECKING:
    from pdserve.v1.decode_pb2_grpc import DecodeAsyncStub

log = logging.getLogger(__name__)


class Aborts:
    def __init__(self, registry: Registry, config: RouterConfig) -> None:
        self.registry = registry
        self.config = config
        # By (decode worker address, request id): a migrated request's id may be pending on the
        # worker it left while it starts on another.
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}

    def later(self, decode: Worker[DecodeAsyncStub], request_id: str) -> None:
        """Aborts `request_id` on `decode` in the background."""
        self.registry.decode.hold(decode)
        task = asyncio.get_running_loop().create_task(self._abort(decode, request_id))
        key = (decode.address, request_id)
        self._pending[key] = task
        task.add_done_callback(lambda _: self._forget(key, task))

    async def settled(self, address: str, request_id: str) -> None:
        """Returns once no abort for `request_id` is pending on the worker at `address`."""
        pending = self._pending.get((address, request_id))
        if pending is not None:
            # shield: cancelling this request must not cancel the Abort it waits for.
            await asyncio.shield(pending)

    async def wait_all(self) -> None:
        """Waits for the aborts sent so far (tests, shutdown)."""
        await asyncio.gather(*self._pending.values(), return_exceptions=True)

    def _forget(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._pending.get(key) is task:
            del self._pending[key]

    async def _abort(self, decode: Worker[DecodeAsyncStub], request_id: str) -> None:
        """Decode.Abort until it answers: it is idempotent, and a lost one would hold the
        reservation's blocks until decode's reservation TTL. Each try gets twice the time, and
        waits twice as long before it: a pod cut off for a while (a partition) gets its aborts
        once it is back, not five refusals within its first seconds away."""
        timeout = self.config.abort_timeout_seconds
        backoff = min(timeout, 1.0)
        try:
            for attempt in range(1, self.config.abort_attempts + 1):
                if attempt > 1:
                    await asyncio.sleep(backoff)
                    timeout *= 2
                    backoff *= 2
                try:
                    await decode.stub.Abort(
                        decode_pb2.AbortRequest(request_id=request_id), timeout=timeout
                    )
                    return
                except grpc.aio.AioRpcError as error:
                    log.warning(
                        "request %s: Abort on %s failed (try %d): %s",
                        request_id,
                        decode.address,
                        attempt,
                        error.code().name,
                    )
        finally:
            self.registry.decode.release(decode)
