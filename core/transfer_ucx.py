"""KV blocks from prefill's cache straight into decode's reserved blocks, over UCX tagged messages.

A transfer, traced (decode: expect -> posted receive -> poll; prefill: send):
1. decode `KVReceiver.expect(request_id, block_ids, layout)` checks the layout, draws a 16-byte
   token, allocates one staging buffer for the whole prompt and posts a UCX tag receive into it
   (tag = 64 bits of the token's hash). It returns a `TransferDescriptor`, which gRPC carries.
2. prefill `KVSender.send(descriptor, cache, src_block_ids, num_tokens)` checks the layout, gathers
   the blocks into one staging buffer followed by the token (caller's thread; the source blocks may
   be freed as soon as `send` returns) and posts one tagged send to decode's worker address. UCX
   moves it zero-copy by rendezvous (CMA over shared memory, or TCP). The returned future completes
   when the receiver has taken the bytes.
3. decode `poll(request_id)`, non-blocking, from the decode engine's thread: once the receive has
   completed and the trailing token matches, it scatters the staging buffer into the reserved blocks
   (on the caller's thread, so no other thread ever writes decode's cache) and answers DONE.

Only a message carrying the token can complete the posted receive, and only a completed receive
with the whole token in its trailer is scattered: a late, foreign or wrong-token message never
lands. `cancel()` completes the posted receive with a one-byte message from this worker to itself
(ucxx exposes no per-request cancel), so the staging buffer is freed at once; a real message
arriving later stays unmatched, and its sender times out.

Threading: see `transfer_ucx_runtime`. `expect`, `poll`, `cancel` and `send` are thread-safe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import threading
import time
from dataclasses import dataclass

import numpy as np
import ucxx._lib.libucxx as ucx_api
from ucxx._lib.arr import Array

from pdserve.core.kv_cache import KVCache, KVLayout
from pdserve.core.transfer_staging import Staging
from pdserve.core.transfer_types import (
    TOKEN_NBYTES,
    SendResult,
    TransferDescriptor,
    TransferError,
    TransferState,
    TransferTimeoutError,
    check_block_ids,
    check_layout,
    check_send_args,
    transfer_tag,
)
from pdserve.core.transfer_ucx_runtime import UcxConfig, UcxRuntime

CLOSE_PERIOD_NS = 10**9
CANCEL_TIMEOUT_S = 5.0


@dataclass
class _Incoming:
    descriptor: TransferDescriptor
    staging: Staging | None
    arrival: concurrent.futures.Future[None]
    started: float
    state: TransferState = TransferState.PENDING
    error: str = ""


class KVReceiver:
    """Decode side: hands out descriptors and lands the bytes in the reserved blocks."""

    def __init__(self, kv_cache: KVCache, config: UcxConfig) -> None:
        self.cache = kv_cache
        self.bytes_received = 0  # whole blocks landed, K and V of every layer
        self.seconds = 0.0  # summed expect() -> DONE time of finished transfers
        self._runtime = UcxRuntime(config)
        self._address: bytes = self._runtime.worker_address
        self._lock = threading.Lock()
        self._incoming: dict[str, _Incoming] = {}
        self._self_endpoint = self._runtime.call(self._connect_to_self())

    def address(self) -> bytes:
        return self._address

    @property
    def num_tracked(self) -> int:
        """Requests expected and not yet cancelled (0 after every scenario: nothing leaked)."""
        with self._lock:
            return len(self._incoming)

    def expect(self, request_id: str, block_ids: list[int], layout: KVLayout) -> TransferDescriptor:
        check_layout(self.cache.layout, layout)
        ids = tuple(block_ids)
        check_block_ids("block_ids", ids, self.cache.num_blocks)
        token = secrets.token_bytes(TOKEN_NBYTES)
        descriptor = TransferDescriptor(request_id, self.address(), ids, layout, token)
        staging = Staging(layout, len(ids))
        with self._lock:
            if request_id in self._incoming:
                raise ValueError(f"request_id: {request_id!r} is already expected")
            arrival = self._runtime.submit(self._receive(staging, transfer_tag(token)))
            self._incoming[request_id] = _Incoming(
                descriptor, staging, arrival, time.perf_counter()
            )
        return descriptor

    def poll(self, request_id: str) -> TransferState:
        """PENDING, DONE (KV is in the reserved blocks) or FAILED; never blocks on the network."""
        with self._lock:
            entry = self._entry(request_id)
            if entry.state is TransferState.PENDING and entry.arrival.done():
                self._land(entry)
            return entry.state

    def error(self, request_id: str) -> str:
        """Why a FAILED transfer failed ("" otherwise)."""
        with self._lock:
            return self._entry(request_id).error

    def cancel(self, request_id: str) -> None:
        """Forgets the request, whatever its state. A pending receive is completed (by a message to
        ourselves) before this returns, so no later message can match it."""
        with self._lock:
            entry = self._incoming.pop(request_id, None)
        if entry is None or entry.arrival.done():
            return
        tag = transfer_tag(entry.descriptor.token)
        self._runtime.submit(self._send_to_self(tag))
        concurrent.futures.wait([entry.arrival], timeout=CANCEL_TIMEOUT_S)

    def close(self) -> None:
        for request_id in list(self._incoming):
            self.cancel(request_id)
        self._runtime.call(_close_endpoint(self._self_endpoint))
        self._runtime.close()

    def _entry(self, request_id: str) -> _Incoming:
        entry = self._incoming.get(request_id)
        if entry is None:
            raise KeyError(f"request_id: {request_id!r} is not expected here")
        return entry

    def _land(self, entry: _Incoming) -> None:
        staging, entry.staging = entry.staging, None
        error = entry.arrival.exception()
        if error is not None or staging is None:
            entry.state, entry.error = TransferState.FAILED, f"receive failed: {error!r}"
        elif not staging.carries(entry.descriptor.token):
            entry.state, entry.error = TransferState.FAILED, "message without the transfer token"
        else:
            staging.scatter_into(self.cache, list(entry.descriptor.block_ids))
            entry.state = TransferState.DONE
            self.bytes_received += staging.payload_nbytes
            self.seconds += time.perf_counter() - entry.started

    async def _receive(self, staging: Staging, tag: int) -> None:
        request = self._runtime.worker.tag_recv(Array(staging.raw.numpy()), ucx_api.UCXXTag(tag))
        await request.wait()

    async def _connect_to_self(self) -> ucx_api.UCXEndpoint:
        return ucx_api.UCXEndpoint.create_from_worker_address(
            self._runtime.worker,
            self._runtime.worker.address,
            self._runtime.config.endpoint_error_handling,
        )

    async def _send_to_self(self, tag: int) -> None:
        pill = np.zeros(1, dtype=np.uint8)
        await self._self_endpoint.tag_send(Array(pill), ucx_api.UCXXTag(tag)).wait()


class KVSender:
    """Prefill side: pushes a prompt's blocks to the decode worker named in a descriptor."""

    def __init__(self, config: UcxConfig) -> None:
        self.bytes_sent = 0  # whole blocks delivered, K and V of every layer
        self.seconds = 0.0  # summed send() -> delivered time (gather + wire)
        self._runtime = UcxRuntime(config)
        self._lock = threading.Lock()
        self._endpoints: dict[bytes, ucx_api.UCXEndpoint] = {}

    def send(
        self,
        descriptor: TransferDescriptor,
        kv_cache: KVCache,
        src_block_ids: list[int],
        num_tokens: int,
    ) -> concurrent.futures.Future[SendResult]:
        """Checks, gathers (the source blocks are free to reuse on return), then ships."""
        check_send_args(descriptor, kv_cache, src_block_ids, num_tokens)
        started = time.perf_counter()
        staging = Staging(descriptor.layout, len(src_block_ids))
        staging.gather_from(kv_cache, list(src_block_ids), descriptor.token)
        gathered = time.perf_counter()
        future: concurrent.futures.Future[SendResult] = self._runtime.submit(
            self._push(descriptor, staging, started)
        )
        return future

    def close(self) -> None:
        for endpoint in list(self._endpoints.values()):
            self._runtime.call(_close_endpoint(endpoint))
        self._endpoints.clear()
        self._runtime.close()

    async def _push(
        self, descriptor: TransferDescriptor, staging: Staging, started: float
    ) -> SendResult:
        peer = descriptor.peer_address
        endpoint = self._endpoint(peer)
        tag = ucx_api.UCXXTag(transfer_tag(descriptor.token))
        waiter = asyncio.ensure_future(endpoint.tag_send(Array(staging.raw.numpy()), tag).wait())
        waiter.add_done_callback(_consume_exception)
        timeout = self._runtime.config.send_timeout_s
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
        if not done:
            # Only closing the endpoint releases a send nobody receives (ucxx has no cancel).
            await self._drop_endpoint(peer)
            raise TransferTimeoutError(
                f"request {descriptor.request_id!r}: decode took no bytes within {timeout} s"
            )
        if waiter.exception() is not None:
            await self._drop_endpoint(peer)
            raise TransferError(f"request {descriptor.request_id!r}: {waiter.exception()!r}")
        seconds = time.perf_counter() - started
        with self._lock:
            self.bytes_sent += staging.payload_nbytes
            self.seconds += seconds
        return SendResult(descriptor.request_id, staging.payload_nbytes, seconds)

    def _endpoint(self, peer: bytes) -> ucx_api.UCXEndpoint:
        endpoint = self._endpoints.get(peer)
        if endpoint is None:
            endpoint = ucx_api.UCXEndpoint.create_from_worker_address(
                self._runtime.worker,
                ucx_api.UCXAddress.create_from_buffer(peer),
                self._runtime.config.endpoint_error_handling,
            )
            self._endpoints[peer] = endpoint
        return endpoint

    async def _drop_endpoint(self, peer: bytes) -> None:
        endpoint = self._endpoints.pop(peer, None)
        if endpoint is not None:
            await _close_endpoint(endpoint)


async def _close_endpoint(endpoint: ucx_api.UCXEndpoint) -> None:
    endpoint.close_blocking(period=CLOSE_PERIOD_NS, max_attempts=1)
    endpoint.remove_close_callback()


def _consume_exception(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
