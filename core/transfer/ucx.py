"""KV blocks from prefill's cache straight into decode's reserved blocks, over UCX tagged messages.

A transfer, traced (decode: expect -> posted receives -> poll; prefill: open -> push... -> done):
1. decode `KVReceiver.expect(request_id, block_ids, layout)` checks the layout, draws a 16-byte
   token, allocates one staging buffer for the whole prompt, split into `num_pieces` pieces (one
   per group of layers, see `staging`), and posts one UCX tag receive per piece (tag = 64 bits of
   a hash of the token and the piece index). It returns a `TransferDescriptor`, which gRPC carries.
   Staging under transfers is bounded (`UcxConfig.staging_limit_bytes`): past the limit, a
   transfer's buffer and receives wait until earlier ones land; its sender's messages wait in
   UCX (unmatched) meanwhile, within the sender's timeout.
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
message from this worker to itself (ucxx exposes no per-request cancel), so a real message arriving
later stays unmatched and its sender times out. It returns at once, never waiting on the network
(it runs on decode's engine thread, which every stream waits for): the staging buffer goes back to
the pool once UCX is done with it, checked on later calls (`_reap`); a receive already matched by
a sender that then stalls keeps its buffer until it completes or CANCEL_TIMEOUT_S passes.

Threading: see `ucx_runtime`. `expect`, `poll`, `cancel` and `open` are thread-safe.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass

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
from pdserve.core.transfer.staging import Staging, StagingPool, block_index, staging_nbytes
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
    """One expected transfer: a posted receive per piece, landed piece by piece. Until its
    staging fits the receiver's limit it waits unposted (no staging, no receive)."""

    def __init__(self, descriptor: TransferDescriptor, staging_nbytes: int) -> None:
        self.descriptor = descriptor
        self.staging_nbytes = staging_nbytes  # what it counts against the staging limit
        self.staging: Staging | None = None  # held from posting until every receive completed
        self.requests: list[ucx_api.UCXRequest] = []  # `completed` is read without blocking
        self.landed: set[int] = set()
        self.started = time.perf_counter()
        self.state = TransferState.PENDING
        self.error = ""

    @property
    def posted(self) -> bool:
        return bool(self.requests)

    @property
    def settled(self) -> bool:
        """Whether UCX is done with the staging buffer (every receive completed)."""
        return all(request.completed for request in self.requests)


@dataclass(frozen=True)
class _Cancelled:
    """A cancelled transfer whose staging buffer UCX may still be writing."""

    entry: _Incoming
    pills: tuple[ucx_api.UCXRequest, ...]  # messages to ourselves that complete its receives
    deadline: float  # monotonic: past it the buffer is let go, not reused


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
        self._cancelled: list[_Cancelled] = []
        self._staging_limit = config.staging_limit_bytes
        self._staging_held = 0  # bytes of staging under transfers (posted, or cancelled)
        self._unposted: deque[_Incoming] = deque()  # waiting for the limit, in arrival order
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
        """Staging memory back in the pool (a landing returns it, a cancel once UCX is done)."""
        self._reap()
        return self._pool.idle_bytes

    @property
    def num_waiting_for_staging(self) -> int:
        """Expected transfers whose receives wait for staging under the limit."""
        with self._lock:
            incoming = self._incoming
            return sum(incoming.get(e.descriptor.request_id) is e for e in self._unposted)

    @property
    def num_cancelling(self) -> int:
        """Cancelled transfers whose staging UCX still holds (a receive matched, not done)."""
        self._reap()
        with self._lock:
            return len(self._cancelled)

    def expect(self, request_id: str, block_ids: list[int], layout: KVLayout) -> TransferDescriptor:
        check_layout(self.cache.layout, layout)
        ids = tuple(block_ids)
        check_block_ids("block_ids", ids, self.cache.num_blocks)
        token = secrets.token_bytes(TOKEN_NBYTES)
        descriptor = TransferDescriptor(
            request_id, self.address(), ids, layout, token, self.num_pieces
        )
        entry = _Incoming(descriptor, staging_nbytes(layout, len(ids), self.num_pieces))
        with self._lock:
            if request_id in self._incoming:
                raise ValueError(f"request_id: {request_id!r} is already expected")
            self._incoming[request_id] = entry
            self._unposted.append(entry)
            self._post_what_fits()
        return descriptor

    def _post_what_fits(self) -> None:
        """Posts the receives of waiting transfers, in arrival order, while their staging fits
        the limit (one at a time always fits, whatever its size). Lock held."""
        while self._unposted:
            entry = self._unposted[0]
            if self._incoming.get(entry.descriptor.request_id) is not entry:
                self._unposted.popleft()  # cancelled while it waited
                continue
            limit = self._staging_limit
            over = limit is not None and self._staging_held + entry.staging_nbytes > limit
            if over and self._staging_held:  # alone, a transfer goes whatever its size
                return
            self._unposted.popleft()
            self._post(entry)

    def _post(self, entry: _Incoming) -> None:
        descriptor = entry.descriptor
        device = self._runtime.config.staging.device_for(self.cache)
        staging = self._pool.acquire(
            descriptor.layout, len(descriptor.block_ids), self.num_pieces, device
        )
        self._runtime.refill_futures()  # one future per receive, made on the loop thread
        entry.requests = [
            self._runtime.worker.tag_recv(
                ucx_buffer(piece.raw), ucx_api.UCXXTag(piece_tag(descriptor.token, index))
            )
            for index, piece in enumerate(staging.pieces)
        ]
        for request in entry.requests:
            # A request's Python future fails when the peer dies mid-transfer; `_land` reads
            # that error from the request itself, so this only retrieves it (else asyncio
            # logs "Future exception was never retrieved" for every failed piece).
            self._runtime.submit(settle(request))
        entry.staging = staging
        self._staging_held += entry.staging_nbytes

    def _give_back(self, entry: _Incoming, staging: Staging | None) -> None:
        """An entry's staging leaves the transfers (to the pool, or let go when None); lock
        held. Its bytes no longer count: a waiting transfer may fit now."""
        if staging is not None:
            self._pool.release(staging)
        self._staging_held -= entry.staging_nbytes
        self._post_what_fits()

    def poll(self, request_id: str) -> TransferState:
        """PENDING, DONE (KV is in the reserved blocks) or FAILED; never blocks on the network."""
        self._reap()
        with self._lock:
            entry = self._entry(request_id)
            if entry.state is TransferState.PENDING and entry.posted:
                self._land(entry)
            return entry.state

    def error(self, request_id: str) -> str:
        """Why a FAILED transfer failed ("" otherwise)."""
        with self._lock:
            return self._entry(request_id).error

    def cancel(self, request_id: str) -> None:
        """Forgets the request, whatever its state, without waiting: every pending receive is
        sent its completing message to ourselves, so no later message can match it; its staging
        buffer returns to the pool once UCX is done with it (`_reap`)."""
        with self._lock:
            entry = self._incoming.pop(request_id, None)
        if entry is None or entry.staging is None:
            return
        token = entry.descriptor.token
        pills = tuple(
            self._self_endpoint.tag_send(
                Array(np.zeros(1, dtype=np.uint8)), ucx_api.UCXXTag(piece_tag(token, index))
            )
            for index, request in enumerate(entry.requests)
            if not request.completed
        )
        with self._lock:
            self._cancelled.append(_Cancelled(entry, pills, time.monotonic() + CANCEL_TIMEOUT_S))
        self._reap()

    def _reap(self) -> None:
        """Returns the staging of cancelled transfers that UCX is done with; one still written
        past its deadline is let go (never reused: UCX may still write it)."""
        if not self._cancelled:  # every poll calls this: no lock when nothing was cancelled
            return
        now = time.monotonic()
        with self._lock:
            waiting = []
            for cancelled in self._cancelled:
                entry = cancelled.entry
                if entry.settled and all(pill.completed for pill in cancelled.pills):
                    self._give_back(entry, entry.staging)
                elif now > cancelled.deadline:
                    log.warning(
                        "KV transfer for %r: a cancelled receive was still in progress after "
                        "%.0f s; its staging buffer is let go",
                        entry.descriptor.request_id,
                        CANCEL_TIMEOUT_S,
                    )
                    self._give_back(entry, None)
                else:
                    waiting.append(cancelled)
            self._cancelled = waiting

    def close(self) -> None:
        """Cancels every expected transfer and waits (up to CANCEL_TIMEOUT_S) for UCX to let go
        of their buffers before the endpoint and the runtime close."""
        for request_id in list(self._incoming):
            self.cancel(request_id)
        deadline = time.monotonic() + CANCEL_TIMEOUT_S
        while self.num_cancelling and time.monotonic() < deadline:
            time.sleep(CANCEL_POLL_S)
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
            self._give_back(entry, staging)
