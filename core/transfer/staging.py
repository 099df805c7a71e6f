"""One contiguous staging buffer per transfer: one message per piece, `[payload | 16-byte token]`.

Why a staging buffer: a block is small (12 KiB per layer for the default model) and the cache is
layer-major, so one prompt's blocks are scattered over `2 * num_layers` places. Gathering them into
one buffer (one `index_select`) turns the transfer into one large UCX message, which UCX sends
zero-copy by rendezvous. Why pieces: with layer-wise push the layers are split into groups
(`layer_groups`), and group p travels as message p, sent as soon as the forward pass has written
its layers; piece p's region is `[group p's layers of every block | token]`, contiguous, so one
piece is still one large message. Why the trailing token: the receiver checks it after the bytes
arrive, so a piece is accepted only when it carries the full 128-bit token (the UCX tag is just 64
bits of a hash of it) and is complete (a short message leaves the trailer empty).

Where the staging memory lives (`UcxConfig.staging`): host memory by default; with
`StagingPlace.DEVICE` it is on the KV cache's device, so between GPU tiers the gather, the wire
(UCX's cuda_copy / cuda_ipc transports) and the scatter never touch host memory. On a CPU cache
both are the same memory.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum

import torch

from pdserve.core.kv.cache import KVCache, KVLayout
from pdserve.core.transfer.interface import TOKEN_NBYTES, layer_groups

HOST = torch.device("cpu")


class StagingPlace(Enum):
    """Where a transfer's staging buffer lives (`--kv-staging`)."""

    HOST = "host"  # host memory: works with every UCX build and every cache device
    DEVICE = "device"  # the KV cache's own device (GPU tiers: no host round trip)

    def device_for(self, cache: KVCache) -> torch.device:
        return cache.tensor.device if self is StagingPlace.DEVICE else HOST


@dataclass(frozen=True)
class Piece:
    """One message: `raw` is `[payload | token]`; `payload` is shaped like `KVCache.gather` for
    the piece's layers only."""

    layers: range
    raw: torch.Tensor
    payload: torch.Tensor

    @property
    def payload_nbytes(self) -> int:
        return self.raw.numel() - TOKEN_NBYTES

    def gather_from(self, cache: KVCache, index: torch.Tensor, token: bytes) -> None:
        source = cache.tensor[self.layers.start : self.layers.stop]
        if cache.tensor.device.type == "cpu":
            torch.index_select(source, 2, index, out=self.payload)
        else:
            self.payload.copy_(source.index_select(2, index))
        trailer = torch.frombuffer(bytearray(token), dtype=torch.uint8)
        self.raw[self.payload_nbytes :] = trailer.to(self.raw.device)
        if self.raw.device.type == "cuda":
            # UCX reads device memory outside torch's stream: the copies must have landed.
            torch.cuda.current_stream(self.raw.device).synchronize()

    def carries(self, token: bytes) -> bool:
        return bytes(self.raw[self.payload_nbytes :].cpu().numpy()) == token

    def scatter_into(self, cache: KVCache, index: torch.Tensor) -> None:
        target = cache.tensor[self.layers.start : self.layers.stop]
        target.index_copy_(2, index, self.payload.to(target.device))


class Staging:
    """Raw bytes `[piece 0 | piece 1 | ...]` over one allocation (what the pool reuses)."""

    def __init__(
        self,
        layout: KVLayout,
        num_blocks: int,
        num_pieces: int = 1,
        memory: torch.Tensor | None = None,
        device: torch.device = HOST,
    ) -> None:
        nbytes = staging_nbytes(layout, num_blocks, num_pieces)
        if memory is None:
            memory = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.memory = memory  # what the pool hands back: may be larger than needed
        self.pieces = _carve(layout, num_blocks, num_pieces, memory[:nbytes])
        self.payload_nbytes: int = sum(piece.payload_nbytes for piece in self.pieces)


def staging_nbytes(layout: KVLayout, num_blocks: int, num_pieces: int) -> int:
    return num_blocks * int(layout.block_nbytes) + num_pieces * TOKEN_NBYTES


def block_index(cache: KVCache, block_ids: list[int] | tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(block_ids, dtype=torch.long, device=cache.tensor.device)


def _carve(layout: KVLayout, num_blocks: int, num_pieces: int, raw: torch.Tensor) -> list[Piece]:
    layer_nbytes = num_blocks * int(layout.block_nbytes) // layout.num_layers
    pieces, offset = [], 0
    for layers in layer_groups(layout.num_layers, num_pieces):
        payload_nbytes = len(layers) * layer_nbytes
        piece_raw = raw[offset : offset + payload_nbytes + TOKEN_NBYTES]
        piece_raw[payload_nbytes:] = 0  # an incomplete message leaves this empty
        shape = layout.shape(num_blocks, num_layers=len(layers))
        payload = piece_raw[:payload_nbytes].view(layout.torch_dtype).view(shape)
        pieces.append(Piece(layers, piece_raw, payload))
        offset += payload_nbytes + TOKEN_NBYTES
    return pieces


class StagingPool:
    """Reuses staging memory: a fresh buffer costs a page fault per 4 KiB on first touch, which on
    a 46 MB prompt took longer than moving the bytes. Keeps at most `max_pooled_bytes` idle."""

    def __init__(self, max_pooled_bytes: int) -> None:
        self.max_pooled_bytes = max_pooled_bytes
        self._idle: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def acquire(
        self, layout: KVLayout, num_blocks: int, num_pieces: int, device: torch.device = HOST
    ) -> Staging:
        needed = staging_nbytes(layout, num_blocks, num_pieces)
        with self._lock:
            fitting = [
                i for i, m in enumerate(self._idle) if m.numel() >= needed and m.device == device
            ]
            # By index, never list.remove: that compares tensors with ==, elementwise.
            best = min(fitting, key=lambda i: self._idle[i].numel()) if fitting else None
            memory = self._idle.pop(best) if best is not None else None
        return Staging(layout, num_blocks, num_pieces, memory, device)

    def release(self, staging: Staging) -> None:
        with self._lock:
            self._idle.append(staging.memory)
            self._idle.sort(key=lambda m: m.numel(), reverse=True)
            while sum(m.numel() for m in self._idle) > self.max_pooled_bytes:
                self._idle.pop()  # drop the smallest first: big prompts gain the most

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            return sum(m.numel() for m in self._idle)
