"""The host-memory offload tier: prefix blocks the pool evicted, kept in preallocated CPU slots.

One `KVCache` tensor on the CPU holds `num_blocks` slots in the pool's own layout, so moving a
block either way is one strided copy of its rows across all layers (what swap does), and the
tier's memory is fixed at start: it never grows with traffic. Slots are keyed by the block's
chained hash (`block_pool.chain_hashes`: equal hashes, equal prefixes, same model and layout) and
leave least recently used first; the caller gets the leaving block (to write it down to disk).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from pdserve.core.kv.block_pool import BlockHash
from pdserve.core.kv.cache import KVCache, KVLayout


class HostTier:
    def __init__(self, layout: KVLayout, num_blocks: int, pin_memory: bool) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
        self.slots = KVCache(layout, num_blocks, "cpu")
        if pin_memory:  # full-speed, asynchronous copies from and to a GPU pool
            self.slots.tensor = self.slots.tensor.pin_memory()
        self._slot_of: OrderedDict[BlockHash, int] = OrderedDict()  # least recently used first
        self._free_slots = list(range(num_blocks))

    @property
    def num_blocks(self) -> int:
        return self.slots.num_blocks

    @property
    def num_used(self) -> int:
        return len(self._slot_of)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._slot_of

    def touch(self, block_hash: BlockHash) -> None:
        """Marks the block most recently used."""
        self._slot_of.move_to_end(block_hash)

    def store(
        self, block_hash: BlockHash, block: torch.Tensor
    ) -> tuple[BlockHash, torch.Tensor] | None:
        """Copies `block` (`[layers, 2, block_size, heads, row]`) into a slot; the least recently
        used block it displaced, as a copy of its own, or None when a slot was free."""
        displaced: tuple[BlockHash, torch.Tensor] | None = None
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            old_hash, slot = self._slot_of.popitem(last=False)
            displaced = (old_hash, self.slots.tensor[:, :, slot].clone())
        self.slots.tensor[:, :, slot].copy_(block)
        self._slot_of[block_hash] = slot
        return displaced

    def load(self, block_hash: BlockHash) -> torch.Tensor | None:
        """A view of the block's slot (most recently used now), or None when not held."""
        slot = self._slot_of.get(block_hash)
        if slot is None:
            return None
        self._slot_of.move_to_end(block_hash)
        return self.slots.tensor[:, :, slot]
