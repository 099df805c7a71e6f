"""The paged KV cache: one tensor for all layers, so one memory region serves swap and UCX.

Shape `[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]` (index 0 of the second dim
is K, 1 is V). `k(layer)` / `v(layer)` are contiguous views `[num_blocks, block_size, kv_heads,
head_dim]`, the layout the attention kernels read. Gathering a set of blocks for every layer at
once (`tensor[:, :, block_ids]`) is one indexing op, which is what swap and transfer staging need.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(frozen=True)
class KVLayout:
    """What both tiers must agree on before KV bytes can move between them."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str  # a key of DTYPES

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block across all layers, K and V."""
        per_layer = 2 * self.block_size * self.num_kv_heads * self.head_dim
        return self.num_layers * per_layer * self.torch_dtype.itemsize


class KVCache:
    """The KV blocks of one worker (device memory on GPU, plain memory on CPU)."""

    def __init__(self, layout: KVLayout, num_blocks: int, device: torch.device | str) -> None:
        self.layout = layout
        self.num_blocks = num_blocks
        self.tensor = torch.zeros(
            (
                layout.num_layers,
                2,
                num_blocks,
                layout.block_size,
                layout.num_kv_heads,
                layout.head_dim,
            ),
            dtype=layout.torch_dtype,
            device=device,
        )

    def k(self, layer: int) -> torch.Tensor:
        return self.tensor[layer, 0]

    def v(self, layer: int) -> torch.Tensor:
        return self.tensor[layer, 1]

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """Copies of the given blocks, all layers: `[layers, 2, len(ids), block, heads, dim]`."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.tensor.device)
        return self.tensor.index_select(2, index)

    def scatter(self, block_ids: list[int], blocks: torch.Tensor) -> None:
        """Writes `blocks` (as returned by `gather`) into the given blocks."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.tensor.device)
        self.tensor.index_copy_(2, index, blocks.to(self.tensor.device))
