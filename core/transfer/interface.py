"""Types shared by every KV transfer backend (UCX in production, in-process for engine tests).

A transfer moves the K/V of one prompt from the prefill tier's KV cache into blocks the decode tier
reserved for it. Decode calls `expect()` first, which hands out a `TransferDescriptor`; that small
frozen message travels to prefill over gRPC; prefill calls `open(descriptor, ...)` and pushes each
piece (a group of layers) as soon as the forward pass has written it, then `done()`; decode polls
`poll(request_id)` from its engine loop until DONE (every piece is in the reserved blocks) or
FAILED. The token in the descriptor is the only thing that lets bytes land in decode's blocks.

What travels is whole blocks: `len(block_ids) * layout.block_nbytes` bytes, also for a prompt that
fills its last block only partly. The counters count exactly those bytes. When decode already holds
the prompt's first `num_cached_blocks` blocks (its prefix cache), `block_ids` are only the blocks
after them: the transfer itself never sees the cached ones. A sliding-window model's decode needs
no block before the window of its first decode step either (`num_slid_blocks`): what travels is
the prompt's blocks from `first_block` on, holding positions `first_position` onwards.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from pdserve.core.kv.cache import KVCache, KVLayout

TOKEN_NBYTES = 16


class TransferState(Enum):
    """What `poll()` answers; PENDING until the bytes are in the reserved blocks."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class TransferError(RuntimeError):
    """A transfer could not complete (peer gone, endpoint error, corrupt message)."""


class TransferTimeoutError(TransferError):
    """The peer did not take the bytes within the configured time."""


class LayoutMismatchError(ValueError):
    """The two tiers disagree on the KV layout; no byte may move (gRPC: FAILED_PRECONDITION)."""

    def __init__(self, expected: KVLayout, got: KVLayout) -> None:
        super().__init__(f"KV layout mismatch: this worker has {expected}, the request has {got}")
        self.expected = expected
        self.got = got


@dataclass(frozen=True)
class TransferDescriptor:
    """Where prefill must push one prompt's KV (mirrors the proto message decode returns)."""

    request_id: str
    peer_address: bytes  # decode's UCX worker address (opaque bytes; a hub key for local)
    block_ids: tuple[int, ...]  # decode-side block ids, in prompt order, after the cached ones
    layout: KVLayout
    token: bytes  # secrets.token_bytes(16): the only credential that lets bytes land
    num_pieces: int = 1  # messages the KV travels in, one per group of layers (decode chooses)
    # Leading prompt blocks decode holds already (its prefix cache): prefill sends its blocks
    # [num_cached_blocks:] into `block_ids`, nothing of the first ones.
    num_cached_blocks: int = 0
    # Leading prompt blocks out of the sliding window of decode's first step: nobody reads them
    # again, so decode holds none and prefill sends none (0 for a full-attention model).
    num_slid_blocks: int = 0

    @property
    def first_block(self) -> int:
        """Index in the prompt of the block `block_ids[0]` receives: the first that travels."""
        return max(self.num_cached_blocks, self.num_slid_blocks)

    @property
    def first_position(self) -> int:
        """The prompt position the first travelling block starts at; the blocks hold every
        position from there to the end of the prompt."""
        return self.first_block * self.layout.block_size

    @property
    def nbytes(self) -> int:
        """Bytes that travel: whole blocks, every layer, K and V."""
        return len(self.block_ids) * int(self.layout.block_nbytes)


@dataclass(frozen=True)
class SendResult:
    """What a finished `send()` reports."""

    request_id: str
    nbytes: int
    seconds: float  # first push -> receiver took every piece (overlaps the forward if layer-wise)
    gather_seconds: float  # of which: copying the blocks into the staging buffer


def piece_tag(token: bytes, piece: int) -> int:
    """The 64-bit UCX tag of one piece, derived from the token (a guess needs 2**64 tries) and the
    piece index (so piece p can only complete the receive posted for piece p)."""
    if len(token) != TOKEN_NBYTES:
        raise ValueError(f"token: expected {TOKEN_NBYTES} bytes, got {len(token)}")
    digest = hashlib.blake2b(token + piece.to_bytes(4, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def layer_groups(num_layers: int, num_pieces: int) -> tuple[range, ...]:
    """Splits the layers into `num_pieces` contiguous groups, sizes differing by at most one."""
    check_num_pieces(num_pieces, num_layers)
    bounds = [num_layers * p // num_pieces for p in range(num_pieces + 1)]
    return tuple(range(bounds[p], bounds[p + 1]) for p in range(num_pieces))


def misplaced_push(piece: int, num_pieces: int, pushed: Collection[int]) -> ValueError | None:
    """Why pushing `piece` now is wrong (pushed before, or no such piece), or None."""
    if piece in pushed or not 0 <= piece < num_pieces:
        return ValueError(f"piece: {piece} pushed twice or outside [0, {num_pieces})")
    return None


def check_num_pieces(num_pieces: int, num_layers: int) -> None:
    if not 1 <= num_pieces <= num_layers:
        raise ValueError(f"num_pieces: must be in [1, {num_layers}] (layers), got {num_pieces}")


def check_layout(own: KVLayout, requested: KVLayout) -> None:
    if own != requested:
        raise LayoutMismatchError(expected=own, got=requested)


def check_block_ids(name: str, block_ids: tuple[int, ...] | list[int], num_blocks: int) -> None:
    """Refuses empty, duplicate or out-of-range ids, naming the field."""
    if not block_ids:
        raise ValueError(f"{name}: at least one block id is required")
    if len(set(block_ids)) != len(block_ids):
        raise ValueError(f"{name}: duplicate block ids in {list(block_ids)}")
    bad = [b for b in block_ids if not 0 <= b < num_blocks]
    if bad:
        raise ValueError(f"{name}: ids {bad} outside [0, {num_blocks})")


def check_send_args(descriptor: TransferDescriptor, cache: KVCache, src: list[int], n: int) -> None:
    """Every check `send()` makes before a byte moves; the layout check comes first."""
    check_layout(cache.layout, descriptor.layout)
    check_block_ids("src_block_ids", src, cache.num_blocks)
    if len(src) != len(descriptor.block_ids):
        raise ValueError(
            f"src_block_ids: {len(src)} blocks, but the descriptor reserves "
            f"{len(descriptor.block_ids)}"
        )
    size = descriptor.layout.block_size
    if not (len(src) - 1) * size < n <= len(src) * size:
        raise ValueError(f"num_tokens: {n} tokens do not fill {len(src)} blocks of {size}")
    if len(descriptor.token) != TOKEN_NBYTES:
        raise ValueError(f"token: expected {TOKEN_NBYTES} bytes, got {len(descriptor.token)}")
    check_num_pieces(descriptor.num_pieces, descriptor.layout.num_layers)


class KVReceiverLike(Protocol):
    """Decode side, as the decode engine uses it (UCX or in-process)."""

    bytes_received: int
    seconds: float

    def address(self) -> bytes: ...

    def expect(
        self, request_id: str, block_ids: list[int], layout: KVLayout
    ) -> TransferDescriptor: ...

    def poll(self, request_id: str) -> TransferState: ...

    def cancel(self, request_id: str) -> None: ...

    def close(self) -> None: ...


class PieceSendLike(Protocol):
    """One transfer being pushed piece by piece (what `KVSenderLike.open` returns)."""

    @property
    def descriptor(self) -> TransferDescriptor: ...

    def push(self, piece: int) -> None:
        """Gathers piece `piece` (its layers must be written) and posts its send; never raises:
        a failure fails `done()`'s future."""

    def done(self) -> concurrent.futures.Future[SendResult]:
        """Completes when every posted piece has settled; fails if a piece failed or was never
        pushed. Call it exactly once on every path (it releases the staging memory)."""
        ...


class KVSenderLike(Protocol):
    """Prefill side, as the prefill engine uses it (UCX or in-process)."""

    bytes_sent: int
    pieces_sent: int
    seconds: float

    def open(
        self,
        descriptor: TransferDescriptor,
        kv_cache: KVCache,
        src_block_ids: list[int],
        num_tokens: int,
    ) -> PieceSendLike: ...

    def close(self) -> None: ...


def send_whole(
    sender: KVSenderLike,
    descriptor: TransferDescriptor,
    kv_cache: KVCache,
    src_block_ids: list[int],
    num_tokens: int,
) -> concurrent.futures.Future[SendResult]:
    """Sends a finished cache's blocks at once: open, push every piece, done."""
    sending = sender.open(descriptor, kv_cache, src_block_ids, num_tokens)
    for piece in range(descriptor.num_pieces):
        sending.push(piece)
    return sending.done()
