"""One contiguous staging buffer per transfer: the gathered blocks, then the 16-byte token.

Why a staging buffer: a block is small (12 KiB per layer for the default model) and the cache is
layer-major, so one prompt's blocks are scattered over `2 * num_layers` places. Gathering them into
one buffer (one `index_select`) turns the transfer into one large UCX message, which UCX sends
zero-copy by rendezvous. Why the trailing token: the receiver checks it after the bytes arrive, so a
message is accepted only when it carries the full 128-bit token (the UCX tag is just 64 bits of
it) and is complete (a short message leaves the trailer empty).
"""

from __future__ import annotations

import threading

import torch

from pdserve.core.kv_cache import KVCache, KVLayout
from pdserve.core.transfer.interface import TOKEN_NBYTES


class Staging:
    """Raw bytes `[payload | token]`; `payload` is a typed view shaped like `KVCache.gather`."""

    def __init__(
        self, layout: KVLayout, num_blocks: int, memory: torch.Tensor | None = None
    ) -> None:
        self.payload_nbytes: int = num_blocks * int(layout.block_nbytes)
        nbytes = self.payload_nbytes + TOKEN_NBYTES
        if memory is None:
            memory = torch.empty(nbytes, dtype=torch.uint8)
        self.memory = memory  # what the pool hands back: may be larger than `raw`
        self.raw = memory[:nbytes]
        self.raw[self.payload_nbytes :] = 0  # an incomplete message leaves this empty
        shape = (
            layout.num_layers,
            2,
            num_blocks,
            layout.block_size,
            layout.num_kv_heads,
            layout.head_dim,
        )
        self.payload = self.raw[: self.payload_nbytes].view(layout.torch_dtype).view(shape)

    def gather_from(self, cache: KVCache, block_ids: list[int], token: bytes) -> None:
        index = torch.tensor(block_ids, dtype=torch.long, device=cache.tensor.device)
        if cache.tensor.device.type == "cpu":
            torch.index_select(cache.tensor, 2, index, out=self.payload)
        else:
            self.payload.copy_(cache.tensor.index_select(2, index))
        self.raw[self.payload_nbytes :] = torch.frombuffer(bytearray(token), dtype=torch.uint8)

    def carries(self, token: bytes) -> bool:
        return bytes(self.raw[self.payload_nbytes :].numpy()) == token

    def scatter_into(self, cache: KVCache, block_ids: list[int]) -> None:
        cache.scatter(block_ids, self.payload)


class StagingPool:
    """Reuses staging memory: a fresh buffer costs a page fault per 4 KiB on first touch, which on
    a 46 MB prompt took longer than moving the bytes. Keeps at most `max_pooled_bytes` idle."""

    def __init__(self, max_pooled_bytes: int) -> None:
        self.max_pooled_bytes = max_pooled_bytes
        self._idle: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def acquire(self, layout: KVLayout, num_blocks: int) -> Staging:
        needed = num_blocks * int(layout.block_nbytes) + TOKEN_NBYTES
        with self._lock:
            fitting = [i for i, m in enumerate(self._idle) if m.numel() >= needed]
            # By index, never list.remove: that compares tensors with ==, elementwise.
            best = min(fitting, key=lambda i: self._idle[i].numel()) if fitting else None
            memory = self._idle.pop(best) if best is not None else None
        return Staging(layout, num_blocks, memory)

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
