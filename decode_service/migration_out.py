"""Live migration out: a draining decode worker's suspended streams and the sender of their KV.

`DecodeEngine.suspend` takes a request out of the batch between two steps and hands it here,
its blocks kept when its KV is all on the device (caught up: every token but the last computed)
and freed otherwise. `migrate` pushes the kept blocks over UCX into another worker's live-migration
reservation with this worker's own `KVSender` (made at the first migration: most workers never
drain), then frees them. A suspended request nobody migrates within the TTL (the router that
suspended it is gone) is freed by `expire`. A worker that drains stays busy until its pushes
have settled (`pending`). Everything here runs on the engine thread but the sender's completion
callback, which only bumps the counters the gauges read, and `pending`, which the drain reads.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.core.errors import KVNotOnDeviceError, NotServedHereError, UnknownRequestError
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.kv.cache import KVCache
from pdserve.core.kv.manager import KVCacheManager
from pdserve.core.request import Request, RequestStatus
from pdserve.core.transfer.interface import (
    KVSenderLike,
    SendResult,
    TransferDescriptor,
    send_whole,
)

SenderFactory = Callable[[], KVSenderLike]


@dataclass(frozen=True)
class _Suspended:
    request: Request
    kv_ready: bool
    since: float


class OutgoingMigrations:
    """Suspended requests waiting for `migrate`, keyed by request id."""

    def __init__(
        self,
        kv_manager: KVCacheManager,
        kv_cache: KVCache,
        block_size: int,
        sender_factory: SenderFactory | None,
        ttl_s: float,
    ) -> None:
        self._kv_manager = kv_manager
        self._kv_cache = kv_cache
        self._block_size = block_size
        self._sender_factory = sender_factory
        self._sender: KVSenderLike | None = None
        self._ttl_s = ttl_s
        self._suspended: dict[str, _Suspended] = {}
        # Pushes not yet settled: a drain waits for them, or stopping the server would cut the
        # Migrate calls (and the transfers) still under way on a slow link.
        self._sending: list[concurrent.futures.Future[SendResult]] = []
        self.num_migrated = 0  # requests whose KV left for another worker
        self.migrated_kv_bytes = 0

    def pending(self) -> bool:
        """Whether a suspended request waits here or its KV is still on the way out (read by
        the drain from the server's thread too: it only reads)."""
        return bool(self._suspended) or any(not sending.done() for sending in self._sending)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._suspended

    def hold(self, request: Request, kv_ready: bool) -> None:
        """Keeps a request taken out of the batch (its blocks freed already unless `kv_ready`)."""
        request.status = RequestStatus.SUSPENDED
        self._suspended[request.request_id] = _Suspended(request, kv_ready, time.monotonic())

    def abort(self, request_id: str) -> bool:
        """Frees a suspended request; whether it was one."""
        suspended = self._suspended.pop(request_id, None)
        if suspended is None:
            return False
        self._free(suspended)
        return True

    def expire(self, now: float) -> None:
        for request_id, suspended in list(self._suspended.items()):
            if now - suspended.since > self._ttl_s:
                self.abort(request_id)

    def migrate(
        self, request_id: str, destination: TransferDescriptor
    ) -> concurrent.futures.Future[SendResult]:
        """Pushes a suspended request's KV into `destination` and frees it here; the future
        settles when the other worker took it all."""
        suspended = self._suspended.pop(request_id, None)
        if suspended is None:
            raise UnknownRequestError(f"request_id: {request_id!r} is not suspended here")
        request = suspended.request
        try:
            if not suspended.kv_ready:
                raise KVNotOnDeviceError(
                    f"request {request_id!r}: its KV was not all on the device; re-prefill it"
                )
            skipped = destination.first_block  # held there already, or out of the window
            computed = request.num_computed_tokens
            sending = send_whole(
                self._kv_sender(),
                destination,
                self._kv_cache,
                request.block_ids[skipped : blocks_for(computed, self._block_size)],
                computed - skipped * self._block_size,
            )
        finally:
            self._free(suspended)  # the pushes copied the blocks out (staging)
        sending.add_done_callback(self._count)
        self._sending = [*(pushing for pushing in self._sending if not pushing.done()), sending]
        return sending

    def close(self) -> None:
        """Closes the sender, if a migration made one."""
        if self._sender is not None:
            self._sender.close()

    def _kv_sender(self) -> KVSenderLike:
        if self._sender is None:
            if self._sender_factory is None:
                raise NotServedHereError("this decode worker has no KV sender for live migration")
            self._sender = self._sender_factory()
        return self._sender

    def _free(self, suspended: _Suspended) -> None:
        self._kv_manager.free(suspended.request)
        suspended.request.status = RequestStatus.FINISHED_ABORTED

    def _count(self, sending: concurrent.futures.Future[SendResult]) -> None:
        """Runs on the sender's thread; plain int updates, read by gauges only."""
        if not sending.cancelled() and sending.exception() is None:
            self.num_migrated += 1
            self.migrated_kv_bytes += sending.result().nbytes
