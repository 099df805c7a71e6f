"""KV blocks from prefill's cache straight into decode's reserved blocks, over UCX tagged messages.

A transfer, traced (decode: expect -> posted receives -> poll; prefill: open -> push... -> done):
1. decode `KVReceiver.expect(request_id, block_ids, layout)` checks the layout, draws a 16-byte
   token, allocates one staging buffer for the whole prompt, split into `num_pieces` pieces (one
   per group of layers, see `staging`), and posts one UCX tag receive per piece (tag = 64 bits of
   a hash of the token and the piece index). It returns a `TransferDescriptor`, which gRPC carries.
2. prefill `KVSender.open(descriptor, cache, src_block_ids, num_tokens)` checks everything and takes
   a staging buffer; `push(p)` (called as soon as the forward pass has written group p's layers)
   gathers that piece followed by the token and posts its tagged send, on the caller's thread; UCX
   moves it zero-copy by rendezvous (CMA over shared memory, or TCP) while the forward goes on.
   `done()`'s future completes when the receiver has taken every piece.
3. decode `poll(request_id)`, non-blocking, from the decode engine's thread: each piece whose
   receive has completed and whose trailing token matches is scattered into its layers of the
   reserved blocks (on the caller's thread, so no other thread ever writes decode's cache); DONE
   once the last piece has landed.

Only a message carrying the token can complete a posted receive, and only a completed receive
with the whole token in its trailer is scattered: a late, foreign or wrong-token piece never
lands (the request is FAILED). `cancel()` completes every still-posted receive with a one-byte
message from this worker to itself (ucxx exposes no per-request cancel), so the staging buffer is
freed at once; a real message arriving later stays unmatched, and its sender times out.

Threading: see `ucx_runtime`. `expect`, `poll`, `cancel` and `open` are thread-safe.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import numpy as np
import ucxx._lib.libucxx as ucx_api
from ucxx._lib.arr import Array

from pdserve.core.kv.cache import KVCache, KVLayout
from pdserve.core.transfer.interface import (
    TOKEN_NBYTES,
    TransferDescriptor,
    TransferState,
    check_block_ids,
    check_layout,
    check_num_pieces,
    piece_tag,
)
from pdserve.core.transfer.staging import Staging, StagingPool, block_index
from pdserve.core.transfer.ucx_runtime import (
    UcxConfig,
    UcxRuntime,
    close_endpoint,
    settle,
    ucx_buffer,
)

log = logging.getLogger(__name__)

CANCEL_TIMEOUT_S = 5.0
CANCEL_POLL_S = 0.0005


class _Incoming:
    """One expected transfer: a posted receive per piece, landed piece by piece."""

    def __init__(
        self,
        descriptor: TransferDescriptor,
        staging: Staging,
        requests: list[ucx_api.UCXRequest],
    ) -> None:
        self.descriptor = descriptor
        self.staging: Staging | None = staging  # None once every receive has completed
        self.requests = requests  # `completed` is read without blocking
        self.landed: set[int] = set()
        self.started = time.perf_counter()
        self.state = TransferState.PENDING
        self.error = ""

    @property
    def settled(self) -> bool:
        """Whether UCX is done with the staging buffer (every receive completed)."""
        return all(request.completed for request in self.requests)


class KVReceiver:
    """Decode side: hands out descriptors and lands the bytes in the reserved blocks.

    Receives are posted from the caller's thread and their completion is read straight from the
    UCX requests in `poll()`, so no thread hand-off sits between the bytes arriving and DONE.
    `num_pieces` is how many messages each transfer travels in (1 = the whole prompt at once).
    """

    def __init__(self, kv_cache: KVCache, config: UcxConfig, num_pieces: int = 1) -> None:
        check_num_pieces(num_pieces, kv_cache.layout.num_layers)
        self.cache = kv_cache
        self.num_pieces = num_pieces
        self.bytes_received = 0  # whole blocks landed, K and V of every layer
        self.rejected_messages = 0  # pieces that arrived without their full token: never landed
        self.seconds = 0.0  # summed expect() -> DONE time of finished transfers
        self._runtime = UcxRuntime(config)
        self._pool = StagingPool(config.staging_pool_bytes)
        self._address: bytes = self._runtime.worker_address
        self._lock = threading.Lock()
        self._incoming: dict[str, _Incoming] = {}
        self._self_endpoint = ucx_api.UCXEndpoint.create_from_worker_address(
            self._runtime.worker, self._runtime.worker.address, config.endpoint_error_handling
        )

    def address(self) -> bytes:
        return self._address

    @property
    def num_tracked(self) -> int:
        """Requests expected and not yet cancelled (0 after every scenario: nothing leaked)."""
        with self._lock:
            return len(self._incoming)

    @property
    def idle_staging_bytes(self) -> int:
        """Staging memory back in the pool (a cancel or a landing returns it)."""
        return self._pool.idle_bytes

    def expect(self, request_id: str, block_ids: list[int], layout: KVLayout) -> TransferDescriptor:
        check_layout(self.cache.layout, layout)
        ids = tuple(block_ids)
        check_block_ids("block_ids", ids, self.cache.num_blocks)
        token = secrets.token_bytes(TOKEN_NBYTES)
        descriptor = TransferDescriptor(
            request_id, self.address(), ids, layout, token, self.num_pieces
        )
        with self._lock:
            if request_id in self._incoming:
                raise ValueError(f"request_id: {request_id!r} is already expected")
            device = self._runtime.config.staging.device_for(self.cache)
            staging = self._pool.acquire(layout, len(ids), self.num_pieces, device)
            self._runtime.refill_futures()  # one future per receive, made on the loop thread
            requests = [
                self._runtime.worker.tag_recv(
                    ucx_buffer(piece.raw), ucx_api.UCXXTag(piece_tag(token, index))
                )
                for index, piece in enumerate(staging.pieces)
            ]
            for request in requests:
                # A request's Python future fails when the peer dies mid-transfer; `_land` reads
                # that error from the request itself, so this only retrieves it (else asyncio
                # logs "Future exception was never retrieved" for every failed piece).
                self._runtime.submit(settle(request))
            self._incoming[request_id] = _Incoming(descriptor, staging, requests)
        return descriptor

    def poll(self, request_id: str) -> TransferState:
        """PENDING, DONE (KV is in the reserved blocks) or FAILED; never blocks on the network."""
        with self._lock:
            entry = self._entry(request_id)
            if entry.state is TransferState.PENDING:
                self._land(entry)
            return entry.state

    def error(self, request_id: str) -> str:
        """Why a FAILED transfer failed ("" otherwise)."""
        with self._lock:
            return self._entry(request_id).error

    def cancel(self, request_id: str) -> None:
        """Forgets the request, whatever its state. Every pending receive is completed (by a
        message to ourselves) before this returns, so no later message can match it."""
        with self._lock:
            entry = self._incoming.pop(request_id, None)
        if entry is None or entry.staging is None:
            return
        token = entry.descriptor.token
        pills = [
            self._self_endpoint.tag_send(
                Array(np.zeros(1, dtype=np.uint8)), ucx_api.UCXXTag(piece_tag(token, index))
            )
            for index, request in enumerate(entry.requests)
            if not request.completed
        ]
        deadline = time.monotonic() + CANCEL_TIMEOUT_S
        while time.monotonic() < deadline and not (
            entry.settled and all(pill.completed for pill in pills)
        ):
            time.sleep(CANCEL_POLL_S)
        if entry.settled:
            self._pool.release(entry.staging)  # else UCX may still write it: let it go

    def close(self) -> None:
        for request_id in list(self._incoming):
            self.cancel(request_id)
        self._runtime.call(close_endpoint(self._self_endpoint))
        self._runtime.close()

    def _entry(self, request_id: str) -> _Incoming:
        entry = self._incoming.get(request_id)
        if entry is None:
            raise KeyError(f"request_id: {request_id!r} is not expected here")
        return entry

    def _count_rejected(self, request_id: str) -> None:
        """Counted always (pdserve_decode_kv_rejected_messages), logged once: a peer sending
        wrong tokens must not be able to flood the log."""
        self.rejected_messages += 1
        if self.rejected_messages == 1:
            log.warning(
                "KV transfer for %r: a message without its token was refused (later ones are "
                "only counted in pdserve_decode_kv_rejected_messages)",
                request_id,
            )

    def _land(self, entry: _Incoming) -> None:
        """Scatters every newly completed piece; a failed or tokenless one fails the transfer."""
        staging = entry.staging
        assert staging is not None  # a PENDING entry holds its staging
        index = block_index(self.cache, entry.descriptor.block_ids)
        for number, request in enumerate(entry.requests):
            if number in entry.landed or not request.completed:
                continue
            piece = staging.pieces[number]
            try:
                request.check_error()
            except ucx_api.UCXError as error:
                entry.state, entry.error = TransferState.FAILED, f"receive failed: {error!r}"
                return  # the staging stays with the entry until every receive completes
            if not piece.carries(entry.descriptor.token):
                entry.state, entry.error = TransferState.FAILED, "message without the token"
                self._count_rejected(entry.descriptor.request_id)
                return
            piece.scatter_into(self.cache, index)
            entry.landed.add(number)
        if len(entry.landed) == len(entry.requests):
            entry.state, entry.staging = TransferState.DONE, None
            self.bytes_received += staging.payload_nbytes
            self.seconds += time.perf_counter() - entry.started
            self._pool.release(staging)
