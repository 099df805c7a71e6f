"""Prefill side of the UCX transfer: pushes a prompt's blocks, piece by piece, into decode's.

`KVSender.open(descriptor, cache, src_block_ids, num_tokens)` checks everything and takes a staging
buffer; `push(p)` gathers group p's layers (plus the token) into piece p and posts its tagged send
on the caller's thread, so the prefill engine can call it from inside the forward pass, right after
those layers wrote their KV; `done()` returns a future that completes on the UCX loop thread once
every piece has been taken by the receiver (see `ucx` for the receiving side and `staging` for the
piece layout). The source blocks may be reused once the last `push` has returned.

A piece for a peer not connected yet is posted by the UCX loop once the connect is done
(`ucx_endpoints`: a connect never runs on the caller's thread), within the send timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import ucxx._lib.libucxx as ucx_api
from ucxx._lib.arr import Array

from pdserve.core.kv.cache import KVCache
from pdserve.core.transfer.interface import (
    SendResult,
    TransferDescriptor,
    TransferError,
    TransferTimeoutError,
    check_send_args,
    piece_tag,
)
from pdserve.core.transfer.piece_send import PieceSendBase, SendCounters
from pdserve.core.transfer.staging import Piece, StagingPool
from pdserve.core.transfer.ucx_endpoints import Connection, Endpoints
from pdserve.core.transfer.ucx_runtime import UcxConfig, UcxRuntime, close_endpoint, ucx_buffer


class KVSender(SendCounters):
    """Prefill side: pushes a prompt's blocks to the decode worker named in a descriptor."""

    def __init__(self, config: UcxConfig) -> None:
        super().__init__()
        self.runtime = UcxRuntime(config)
        self.pool = StagingPool(config.staging_pool_bytes)
        self.endpoints = Endpoints(self.runtime)

    def open(
        self,
        descriptor: TransferDescriptor,
        kv_cache: KVCache,
        src_block_ids: list[int],
        num_tokens: int,
    ) -> PieceSend:
        """Checks the arguments (layout first; raises before any byte moves)."""
        check_send_args(descriptor, kv_cache, src_block_ids, num_tokens)
        self.runtime.refill_futures()  # the pieces' sends are posted from the caller's thread
        return PieceSend(self, descriptor, kv_cache, src_block_ids)

    def close(self) -> None:
        for endpoint in self.endpoints.take_all():
            self.runtime.call(close_endpoint(endpoint))
        self.runtime.close()

    async def send_when_connected(
        self,
        descriptor: TransferDescriptor,
        connection: Connection,
        buffer: Array,
        tag: ucx_api.UCXXTag,
    ) -> None:
        """Posts a send once the endpoint it needs is connected, then waits for it (each wait
        bounded by the send timeout)."""
        timeout = self.runtime.config.send_timeout_s
        waiter = asyncio.shield(asyncio.wrap_future(connection))  # shared with other sends
        try:
            endpoint = await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            raise TransferTimeoutError(
                f"request {descriptor.request_id!r}: no connection to decode within {timeout} s"
            ) from None
        except ucx_api.UCXError as error:
            raise TransferError(f"peer_address: cannot connect to it: {error!r}") from error
        request = self.post(endpoint, buffer, tag)
        await self.completion(descriptor, endpoint, request)

    def post(
        self, endpoint: ucx_api.UCXEndpoint, buffer: Array, tag: ucx_api.UCXXTag
    ) -> ucx_api.UCXRequest:
        """Posts one tagged send (any thread), counted in flight on its endpoint."""
        try:
            request = endpoint.tag_send(buffer, tag)
        except ucx_api.UCXError as error:
            raise TransferError(f"peer_address: cannot send to it: {error!r}") from error
        self.endpoints.posted(endpoint)
        return request

    async def completion(
        self,
        descriptor: TransferDescriptor,
        endpoint: ucx_api.UCXEndpoint,
        request: ucx_api.UCXRequest,
    ) -> None:
        """Waits for one posted send; after a timeout or an error the endpoint is retired
        (`Endpoints.retire`: the other transfers on it go on) and this one raises."""
        waiter = asyncio.ensure_future(request.wait())
        waiter.add_done_callback(_consume_exception)
        timeout = self.runtime.config.send_timeout_s
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
        failed = not done or waiter.exception() is not None
        if failed:
            self.endpoints.retire(descriptor.peer_address, endpoint)
        if self.endpoints.settled(endpoint):
            # Only closing it releases a send nobody receives (ucxx has no cancel).
            await close_endpoint(endpoint)
        if not done:
            raise SendAbandonedError(
                f"request {descriptor.request_id!r}: decode took no bytes within {timeout} s"
            )
        if failed:
            raise TransferError(f"request {descriptor.request_id!r}: {waiter.exception()!r}")


class SendAbandonedError(TransferTimeoutError):
    """A posted send that its receiver did not take in time: given up, but still posted on its
    (retired) endpoint until that closes."""


class PieceSend(PieceSendBase):
    """A transfer over UCX: each piece is a tagged send posted on the caller's thread; `done()`
    completes on the UCX loop thread once every send was taken by the receiver."""

    def __init__(
        self, sender: KVSender, descriptor: TransferDescriptor, cache: KVCache, src: list[int]
    ) -> None:
        staging = sender.pool.acquire(
            descriptor.layout,
            len(src),
            descriptor.num_pieces,
            sender.runtime.config.staging.device_for(cache),
        )
        super().__init__(descriptor, cache, src, staging)
        self._sender = sender
        self._sends: list[concurrent.futures.Future[None]] = []

    def _send(self, piece: int, target: Piece) -> None:
        sender, descriptor = self._sender, self.descriptor
        tag = ucx_api.UCXXTag(piece_tag(descriptor.token, piece))
        connection = sender.endpoints.connection(descriptor.peer_address)
        if not connection.done() or connection.exception() is not None:
            buffer = ucx_buffer(target.raw)
            waiting = sender.send_when_connected(descriptor, connection, buffer, tag)
            self._sends.append(sender.runtime.submit(waiting))
            return
        endpoint = connection.result()
        try:
            request = sender.post(endpoint, ucx_buffer(target.raw), tag)
        except TransferError as error:
            self._errors.append(error)
            return
        self._sends.append(sender.runtime.submit(sender.completion(descriptor, endpoint, request)))

    def done(self) -> concurrent.futures.Future[SendResult]:
        self._note_missing_pieces()
        return self._sender.runtime.submit(self._finish())

    async def _finish(self) -> SendResult:
        outcomes = await asyncio.gather(
            *(asyncio.wrap_future(send) for send in self._sends), return_exceptions=True
        )
        if not any(isinstance(outcome, SendAbandonedError) for outcome in outcomes):
            self._sender.pool.release(self._staging)  # every send settled: UCX is done with it
        # else a send given up is still posted on its retired endpoint until that closes: the
        # buffer is let go, never reused.
        failures = [o for o in outcomes if isinstance(o, BaseException)] + self._errors
        if failures:
            raise failures[0]
        return self._delivered(self._sender)


def _consume_exception(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
