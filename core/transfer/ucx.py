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

Threading: see `ucx_runtime`. `expect`, `poll`, `cancel` and `send` are thread-safe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import secrets
import threading
import time
from dataclasses import dataclass

import numpy as np
import ucxx._lib.libucxx as ucx_api
from ucxx._lib.arr import Array

from pdserve.core.kv_cache import KVCache, KVLayout
from pdserve.core.transfer.interface import (
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
from pdserve.core.transfer.staging import Staging, StagingPool
from pdserve.core.transfer.ucx_runtime import UcxConfig, UcxRuntime

CLOSE_PERIOD_NS = 10**9
CANCEL_TIMEOUT_S = 5.0
CANCEL_POLL_S = 0.0005


@dataclass
class _Incoming:
    descriptor: TransferDescriptor
    staging: Staging | None
    request: ucx_api.UCXRequest  # the posted tag receive; `completed` is read without blocking
    started: float
    state: TransferState = TransferState.PENDING
    error: str = ""


class KVReceiver:
    """Decode side: hands out descriptors and lands the bytes in the reserved blocks.

    Receives are posted from the caller's thread and their completion is read straight from the
    UCX request in `poll()`, so no thread hand-off sits between the bytes arriving and DONE.
    """

    def __init__(self, kv_cache: KVCache, config: UcxConfig) -> None:
        self.cache = kv_cache
        self.bytes_received = 0  # whole blocks landed, K and V of every layer
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

    def expect(self, request_id: str, block_ids: list[int], layout: KVLayout) -> TransferDescriptor:
        check_layout(self.cache.layout, layout)
        ids = tuple(block_ids)
        check_block_ids("block_ids", ids, self.cache.num_blocks)
        token = secrets.token_bytes(TOKEN_NBYTES)
        descriptor = TransferDescriptor(request_id, self.address(), ids, layout, token)
        with self._lock:
            if request_id in self._incoming:
                raise ValueError(f"request_id: {request_id!r} is already expected")
            staging = self._pool.acquire(layout, len(ids))
            request = self._runtime.worker.tag_recv(
                Array(staging.raw.numpy()), ucx_api.UCXXTag(transfer_tag(token))
            )
            # The request's Python future fails when the peer dies mid-transfer; `_land` reads
            # that error from the request itself, so this only retrieves it (else asyncio logs
            # "Future exception was never retrieved" for every failed transfer).
            self._runtime.submit(_settle(request))
            self._incoming[request_id] = _Incoming(
                descriptor, staging, request, time.perf_counter()
            )
        return descriptor

    def poll(self, request_id: str) -> TransferState:
        """PENDING, DONE (KV is in the reserved blocks) or FAILED; never blocks on the network."""
        with self._lock:
            entry = self._entry(request_id)
            if entry.state is TransferState.PENDING and entry.request.completed:
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
        if entry is None or entry.staging is None:
            return
        tag = ucx_api.UCXXTag(transfer_tag(entry.descriptor.token))
        pill = self._self_endpoint.tag_send(Array(np.zeros(1, dtype=np.uint8)), tag)
        deadline = time.monotonic() + CANCEL_TIMEOUT_S
        while not (entry.request.completed and pill.completed) and time.monotonic() < deadline:
            time.sleep(CANCEL_POLL_S)
        if entry.request.completed:
            self._pool.release(entry.staging)  # else UCX may still write it: let it go

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
        assert staging is not None  # only a PENDING entry lands, and it holds its staging
        try:
            entry.request.check_error()
        except ucx_api.UCXError as error:
            entry.state, entry.error = TransferState.FAILED, f"receive failed: {error!r}"
        else:
            if staging.carries(entry.descriptor.token):
                staging.scatter_into(self.cache, list(entry.descriptor.block_ids))
                entry.state = TransferState.DONE
                self.bytes_received += staging.payload_nbytes
                self.seconds += time.perf_counter() - entry.started
            else:
                entry.state, entry.error = TransferState.FAILED, "message without the token"
        self._pool.release(staging)


class KVSender:
    """Prefill side: pushes a prompt's blocks to the decode worker named in a descriptor."""

    def __init__(self, config: UcxConfig) -> None:
        self.bytes_sent = 0  # whole blocks delivered, K and V of every layer
        self.seconds = 0.0  # summed send() -> delivered time (gather + wire)
        self._runtime = UcxRuntime(config)
        self._pool = StagingPool(config.staging_pool_bytes)
        self._lock = threading.Lock()
        self._endpoints: dict[bytes, ucx_api.UCXEndpoint] = {}

    def send(
        self,
        descriptor: TransferDescriptor,
        kv_cache: KVCache,
        src_block_ids: list[int],
        num_tokens: int,
    ) -> concurrent.futures.Future[SendResult]:
        """Checks, gathers and posts the send on the caller's thread (the source blocks are free to
        reuse on return); the future completes on the UCX loop thread."""
        check_send_args(descriptor, kv_cache, src_block_ids, num_tokens)
        started = time.perf_counter()
        staging = self._pool.acquire(descriptor.layout, len(src_block_ids))
        staging.gather_from(kv_cache, list(src_block_ids), descriptor.token)
        gather_s = time.perf_counter() - started
        tag = ucx_api.UCXXTag(transfer_tag(descriptor.token))
        try:
            endpoint = self._endpoint(descriptor.peer_address)
            request = endpoint.tag_send(Array(staging.raw.numpy()), tag)
        except ucx_api.UCXError as error:
            self._pool.release(staging)
            failed: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
            failed.set_exception(TransferError(f"peer_address: cannot send to it: {error!r}"))
            return failed
        future: concurrent.futures.Future[SendResult] = self._runtime.submit(
            self._finish(descriptor, staging, request, started, gather_s)
        )
        return future

    def close(self) -> None:
        with self._lock:
            endpoints, self._endpoints = list(self._endpoints.values()), {}
        for endpoint in endpoints:
            self._runtime.call(_close_endpoint(endpoint))
        self._runtime.close()

    async def _finish(
        self,
        descriptor: TransferDescriptor,
        staging: Staging,
        request: ucx_api.UCXRequest,
        started: float,
        gather_s: float,
    ) -> SendResult:
        try:
            await self._completion(descriptor, request)
        finally:
            self._pool.release(staging)  # sent, or its endpoint closed: UCX is done with it
        seconds = time.perf_counter() - started
        with self._lock:
            self.bytes_sent += staging.payload_nbytes
            self.seconds += seconds
        return SendResult(descriptor.request_id, staging.payload_nbytes, seconds, gather_s)

    async def _completion(
        self, descriptor: TransferDescriptor, request: ucx_api.UCXRequest
    ) -> None:
        waiter = asyncio.ensure_future(request.wait())
        waiter.add_done_callback(_consume_exception)
        timeout = self._runtime.config.send_timeout_s
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
        if not done:
            # Only closing the endpoint releases a send nobody receives (ucxx has no cancel).
            await self._drop_endpoint(descriptor.peer_address)
            raise TransferTimeoutError(
                f"request {descriptor.request_id!r}: decode took no bytes within {timeout} s"
            )
        if waiter.exception() is not None:
            await self._drop_endpoint(descriptor.peer_address)
            raise TransferError(f"request {descriptor.request_id!r}: {waiter.exception()!r}")

    def _endpoint(self, peer: bytes) -> ucx_api.UCXEndpoint:
        """One cached endpoint per decode worker (creating one costs ~0.1 s)."""
        with self._lock:
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
        with self._lock:
            endpoint = self._endpoints.pop(peer, None)
        if endpoint is not None:
            await _close_endpoint(endpoint)


async def _close_endpoint(endpoint: ucx_api.UCXEndpoint) -> None:
    endpoint.close_blocking(period=CLOSE_PERIOD_NS, max_attempts=1)
    endpoint.remove_close_callback()


async def _settle(request: ucx_api.UCXRequest) -> None:
    with contextlib.suppress(Exception):
        await request.wait()


def _consume_exception(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
