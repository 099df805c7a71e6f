"""One contiguous staging buffer per transfer: the gathered blocks, then the 16-byte token.

Why a staging buffer: a block is small (12 KiB per layer for the default model) and the cache is
layer-major, so one prompt's blocks are scattered over `2 * num_layers` places. Gathering them into
one buffer (one `index_select`) turns the transfer into one large UCX message, which UCX sends
zero-copy by rendezvous. Why the trailing token: the receiver checks it after the bytes arrive, so a
message is accepted only when it carries the full 128-bit token (the UCX tag is just 64 bits of
it) and is complete (a short message leaves the trailer empty).
"""

from __future__ import annotations

import torch

from pdserve.core.kv_cache import KVCache, KVLayout
from pdserve.core.transfer_types import TOKEN_NBYTES


class Staging:
    """Raw bytes `[payload | token]`; `payload` is a typed view shaped like `KVCache.gather`."""

    def __init__(self, layout: KVLayout, num_blocks: int) -> None:
        self.payload_nbytes: int = num_blocks * int(layout.block_nbytes)
        self.raw = torch.empty(self.payload_nbytes + TOKEN_NBYTES, dtype=torch.uint8)
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
