"""The paged KV cache: one tensor for all layers, so one memory region serves swap and UCX.

Shape `[num_layers, 2, num_blocks, block_size, num_kv_heads, row_width]` (index 0 of the second
dim is K, 1 is V). `row_width` is `head_dim`, or `head_dim + 4` for an int8 cache, whose rows are
int8 values followed by their float32 scale (`pdserve.kernels.kv_quant`): the scales live inside
the blocks, so the tensor stays one region. `k(layer)` / `v(layer)` are contiguous views
`[num_blocks, block_size, kv_heads, row_width]`, the layout the attention kernels read. Gathering
a set of blocks for every layer at once (`tensor[:, :, block_ids]`) is one indexing op, which is
what swap and transfer staging need.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdserve.core.config import INT8, MODEL_DTYPES
from pdserve.kernels.kv_quant import SCALE_NBYTES, row_width

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in MODEL_DTYPES}
# What a cache may hold: the model's dtype, or int8 rows with scales (`--kv-cache-dtype int8`).
KV_DTYPES: dict[str, torch.dtype] = {**DTYPES, INT8: torch.int8}


@dataclass(frozen=True)
class KVLayout:
    """What both tiers must agree on before KV bytes can move between them."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str  # a key of KV_DTYPES: the cache's element type, so int8 and float tiers differ

    @property
    def torch_dtype(self) -> torch.dtype:
        return KV_DTYPES[self.dtype]

    @property
    def row_width(self) -> int:
        """Elements per (token, KV head) row: head_dim, plus the scale's bytes when int8."""
        return row_width(self.head_dim, self.dtype == INT8)

    def shape(self, num_blocks: int, num_layers: int | None = None) -> tuple[int, ...]:
        """The cache tensor's shape for `num_blocks` blocks (of `num_layers`, default all)."""
        layers = self.num_layers if num_layers is None else num_layers
        return (layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.row_width)

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block across all layers, K and V (scales included)."""
        per_layer = 2 * self.block_size * self.num_kv_heads * self.row_width
        return self.num_layers * per_layer * self.torch_dtype.itemsize


class KVCache:
    """The KV blocks of one worker (device memory on GPU, plain memory on CPU)."""

    def __init__(self, layout: KVLayout, num_blocks: int, device: torch.device | str) -> None:
        if layout.dtype == INT8 and layout.head_dim % SCALE_NBYTES:
            # The scale is read as a float32 view of each row's tail: it must be 4-byte aligned.
            raise ValueError(
                f"kv_cache_dtype: int8 needs head_dim a multiple of {SCALE_NBYTES}, "
                f"got {layout.head_dim}"
            )
        self.layout = layout
        self.num_blocks = num_blocks
        self.tensor = torch.zeros(layout.shape(num_blocks), dtype=layout.torch_dtype, device=device)

    def k(self, layer: int) -> torch.Tensor:
        return self.tensor[layer, 0]

    def v(self, layer: int) -> torch.Tensor:
        return self.tensor[layer, 1]

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """Copies of the given blocks, all layers: `[layers, 2, len(ids), block, heads, row]`."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.tensor.device)
        return self.tensor.index_select(2, index)

    def scatter(self, block_ids: list[int], blocks: torch.Tensor) -> None:
        """Writes `blocks` (as returned by `gather`) into the given blocks."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.tensor.device)
        self.tensor.index_copy_(2, index, blocks.to(self.tensor.device))
