"""In-process KV transfer with the UCX backend's interface: FOR ENGINE UNIT TESTS ONLY.

No UCX, no threads: `LocalKVSender.send` copies the blocks through the same staging buffer (token
trailer included) into the receiver's table at once, and `LocalKVReceiver.poll` lands them in the
reserved blocks, with the same checks and the same states as `KVReceiver` / `KVSender`. A
`LocalTransferHub` stands for the network: it maps receiver addresses to receivers, and
`break_peer(address)` makes sends to it fail, so engine tests can drive the FAILED paths.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import secrets
import time
from dataclasses import dataclass

from pdserve.core.kv_cache import KVCache, KVLayout
from pdserve.core.transfer.interface import (
    TOKEN_NBYTES,
    SendResult,
    TransferDescriptor,
    TransferError,
    TransferState,
    check_block_ids,
    check_layout,
    check_send_args,
)
from pdserve.core.transfer.staging import Staging


class LocalTransferHub:
    """The 'network' between local senders and receivers of one test."""

    def __init__(self) -> None:
        self._receivers: dict[bytes, LocalKVReceiver] = {}
        self._broken: set[bytes] = set()
        self._ids = itertools.count()

    def attach(self, receiver: LocalKVReceiver) -> bytes:
        address = f"local-{next(self._ids)}".encode()
        self._receivers[address] = receiver
        return address

    def break_peer(self, address: bytes) -> None:
        """From now on, sends to `address` fail with TransferError."""
        self._broken.add(address)

    def deliver(self, descriptor: TransferDescriptor, staging: Staging) -> None:
        receiver = self._receivers.get(descriptor.peer_address)
        if receiver is None or descriptor.peer_address in self._broken:
            raise TransferError(f"peer_address: {descriptor.peer_address!r} is unreachable")
        receiver.accept(descriptor, staging)


@dataclass
class _Entry:
    descriptor: TransferDescriptor
    started: float
    staging: Staging | None = None
    state: TransferState = TransferState.PENDING


class LocalKVReceiver:
    """Decode side of the in-process backend (same methods and counters as `KVReceiver`)."""

    def __init__(self, hub: LocalTransferHub, kv_cache: KVCache) -> None:
        self.cache = kv_cache
        self.bytes_received = 0
        self.seconds = 0.0
        self._entries: dict[str, _Entry] = {}
        self._address = hub.attach(self)

    def address(self) -> bytes:
        return self._address

    @property
    def num_tracked(self) -> int:
        return len(self._entries)

    def expect(self, request_id: str, block_ids: list[int], layout: KVLayout) -> TransferDescriptor:
        check_layout(self.cache.layout, layout)
        ids = tuple(block_ids)
        check_block_ids("block_ids", ids, self.cache.num_blocks)
        if request_id in self._entries:
            raise ValueError(f"request_id: {request_id!r} is already expected")
        token = secrets.token_bytes(TOKEN_NBYTES)
        descriptor = TransferDescriptor(request_id, self._address, ids, layout, token)
        self._entries[request_id] = _Entry(descriptor, time.perf_counter())
        return descriptor

    def accept(self, descriptor: TransferDescriptor, staging: Staging) -> None:
        """Keeps a delivered message only if it carries the token of a pending request."""
        entry = self._entries.get(descriptor.request_id)
        if entry is None or entry.staging is not None or entry.state is not TransferState.PENDING:
            return
        if staging.carries(entry.descriptor.token):
            entry.staging = staging

    def poll(self, request_id: str) -> TransferState:
        entry = self._entries.get(request_id)
        if entry is None:
            raise KeyError(f"request_id: {request_id!r} is not expected here")
        if entry.state is TransferState.PENDING and entry.staging is not None:
            entry.staging.scatter_into(self.cache, list(entry.descriptor.block_ids))
            self.bytes_received += entry.staging.payload_nbytes
            self.seconds += time.perf_counter() - entry.started
            entry.state, entry.staging = TransferState.DONE, None
        return entry.state

    def cancel(self, request_id: str) -> None:
        self._entries.pop(request_id, None)

    def close(self) -> None:
        self._entries.clear()


class LocalKVSender:
    """Prefill side of the in-process backend (same `send` and counters as `KVSender`)."""

    def __init__(self, hub: LocalTransferHub) -> None:
        self.bytes_sent = 0
        self.seconds = 0.0
        self._hub = hub

    def send(
        self,
        descriptor: TransferDescriptor,
        kv_cache: KVCache,
        src_block_ids: list[int],
        num_tokens: int,
    ) -> concurrent.futures.Future[SendResult]:
        check_send_args(descriptor, kv_cache, src_block_ids, num_tokens)
        started = time.perf_counter()
        staging = Staging(descriptor.layout, len(src_block_ids))
        staging.gather_from(kv_cache, list(src_block_ids), descriptor.token)
        gathered = time.perf_counter()
        future: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
        try:
            self._hub.deliver(descriptor, staging)
        except TransferError as error:
            future.set_exception(error)
            return future
        seconds = time.perf_counter() - started
        self.bytes_sent += staging.payload_nbytes
        self.seconds += seconds
        future.set_result(
            SendResult(descriptor.request_id, staging.payload_nbytes, seconds, gathered - started)
        )
        return future

    def close(self) -> None:
        return None
