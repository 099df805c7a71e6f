"""In-process KV transfer with the UCX backend's interface: FOR ENGINE UNIT TESTS ONLY.

No UCX, no threads: each `push` of a `LocalKVSender.open` handle copies one piece through the same
staging layout (token trailer included) into the receiver's table at once, and
`LocalKVReceiver.poll` lands them in the reserved blocks once every piece is there, with the same
checks and the same states as `KVReceiver` / `KVSender`. A
`LocalTransferHub` stands for the network: it maps receiver addresses to receivers, and
`break_peer(address)` makes sends to it fail, so engine tests can drive the FAILED paths.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import secrets
import time
from dataclasses import dataclass, field

from pdserve.core.kv.cache import KVCache, KVLayout
from pdserve.core.transfer.interface import (
    TOKEN_NBYTES,
    SendResult,
    TransferDescriptor,
    TransferError,
    TransferState,
    check_block_ids,
    check_layout,
    check_num_pieces,
    check_send_args,
)
from pdserve.core.transfer.piece_send import PieceSendBase, SendCounters
from pdserve.core.transfer.staging import Piece, Staging, block_index


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

    def deliver(self, descriptor: TransferDescriptor, number: int, piece: Piece) -> None:
        receiver = self._receivers.get(descriptor.peer_address)
        if receiver is None or descriptor.peer_address in self._broken:
            raise TransferError(f"peer_address: {descriptor.peer_address!r} is unreachable")
        receiver.accept(descriptor, number, piece)


@dataclass
class _Entry:
    descriptor: TransferDescriptor
    started: float
    pieces: dict[int, Piece] = field(default_factory=dict)
    state: TransferState = TransferState.PENDING


class LocalKVReceiver:
    """Decode side of the in-process backend (same methods and counters as `KVReceiver`)."""

    def __init__(self, hub: LocalTransferHub, kv_cache: KVCache, num_pieces: int = 1) -> None:
        check_num_pieces(num_pieces, kv_cache.layout.num_layers)
        self.cache = kv_cache
        self.num_pieces = num_pieces
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
        descriptor = TransferDescriptor(
            request_id, self._address, ids, layout, token, self.num_pieces
        )
        self._entries[request_id] = _Entry(descriptor, time.perf_counter())
        return descriptor

    def accept(self, descriptor: TransferDescriptor, number: int, piece: Piece) -> None:
        """Keeps a delivered piece only if it carries the token of a pending request."""
        entry = self._entries.get(descriptor.request_id)
        if entry is None or number in entry.pieces or entry.state is not TransferState.PENDING:
            return
        if piece.carries(entry.descriptor.token):
            entry.pieces[number] = piece

    def poll(self, request_id: str) -> TransferState:
        entry = self._entries.get(request_id)
        if entry is None:
            raise KeyError(f"request_id: {request_id!r} is not expected here")
        if entry.state is TransferState.PENDING and len(entry.pieces) == self.num_pieces:
            index = block_index(self.cache, entry.descriptor.block_ids)
            for piece in entry.pieces.values():
                piece.scatter_into(self.cache, index)
                self.bytes_received += piece.payload_nbytes
            self.seconds += time.perf_counter() - entry.started
            entry.state, entry.pieces = TransferState.DONE, {}
        return entry.state

    def cancel(self, request_id: str) -> None:
        self._entries.pop(request_id, None)

    def close(self) -> None:
        self._entries.clear()


class LocalKVSender(SendCounters):
    """Prefill side of the in-process backend (same `open` and counters as `KVSender`)."""

    def __init__(self, hub: LocalTransferHub) -> None:
        super().__init__()
        self.hub = hub

    def open(
        self,
        descriptor: TransferDescriptor,
        kv_cache: KVCache,
        src_block_ids: list[int],
        num_tokens: int,
    ) -> LocalPieceSend:
        check_send_args(descriptor, kv_cache, src_block_ids, num_tokens)
        return LocalPieceSend(self, descriptor, kv_cache, src_block_ids)

    def close(self) -> None:
        return None


class LocalPieceSend(PieceSendBase):
    """Each `push` delivers its piece at once; `done()` reports the first failure, if any."""

    def __init__(
        self, sender: LocalKVSender, descriptor: TransferDescriptor, cache: KVCache, src: list[int]
    ) -> None:
        staging = Staging(descriptor.layout, len(src), descriptor.num_pieces)
        super().__init__(descriptor, cache, src, staging)
        self._sender = sender

    def _send(self, piece: int, target: Piece) -> None:
        try:
            self._sender.hub.deliver(self.descriptor, piece, target)
        except TransferError as error:
            self._errors.append(error)

    def done(self) -> concurrent.futures.Future[SendResult]:
        future: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
        self._note_missing_pieces()
        if self._errors:
            future.set_exception(self._errors[0])
        else:
            future.set_result(self._delivered(self._sender))
        return future
