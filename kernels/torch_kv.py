"""KV-cache writes and block copies in plain torch (CPU pools, and CPU<->GPU swap)."""

from __future__ import annotations

import torch

from ._checks import check_copy_blocks_args, check_write_kv_args
from .kv_quant import is_quantized, quantize


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    checked: bool = False,
) -> None:
    """Stores token i's K/V at flat slot `slot_mapping[i]` (block_id * block_size + offset).
    `checked`: the caller already validated these same arguments this step (see kernels).
    An int8 cache gets each (token, head) row quantized with its own scale (kv_quant)."""
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    if not checked:
        check_write_kv_args(k, v, k_cache, v_cache, slot_mapping)
        _check_slot_range(slot_mapping, num_slots)
    if is_quantized(k_cache):
        k, v = quantize(k), quantize(v)
    # Per-layer caches are contiguous, so the flat-slot view is free.
    k_cache.view(num_slots, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(num_slots, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


def _check_slot_range(slot_mapping: torch.Tensor, num_slots: int) -> None:
    if slot_mapping.numel() > 0:
        low, high = slot_mapping.min().item(), slot_mapping.max().item()
        if low < 0 or high >= num_slots:
            raise ValueError(f"slot_mapping: slots {low}..{high} outside 0..{num_slots - 1}")


def copy_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    dim: int = 0,
) -> None:
    """`dst[.., dst_ids[i], ..] = src[.., src_ids[i], ..]` along `dim`; devices may differ."""
    check_copy_blocks_args(src, dst, src_ids, dst_ids, dim)
    if src_ids.numel() == 0:
        return
    gathered = src.index_select(dim, src_ids.to(device=src.device, dtype=torch.long))
    dst.index_copy_(dim, dst_ids.to(device=dst.device, dtype=torch.long), gathered.to(dst.device))
