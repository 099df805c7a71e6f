"""Kernel ops, one dispatching entry per op (see docs/kernels.md for the dispatch rules).

Which implementation runs is decided by `_backend.use_triton(device)`: Triton on CUDA tensors,
Triton's interpreter on CPU tensors only when TRITON_INTERPRET=1 (tests), torch otherwise. The
Triton modules are imported on first use, so CPU serving never imports triton.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import _backend, torch_attention, torch_kv

__all__ = ["copy_blocks", "paged_attention_decode", "paged_attention_prefill", "write_kv"]


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """One query per sequence over its paged K/V: `[num_seqs, heads, dim]` in q's dtype."""
    if _backend.use_triton(q.device):
        from . import triton_decode

        return triton_decode.decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window
        )
    return torch_attention.decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window
    )


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of packed query chunks (the last tokens of each sequence) over paged K/V."""
    if _backend.use_triton(q.device):
        from . import triton_prefill

        return triton_prefill.prefill_attention(
            q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, sliding_window
        )
    return torch_attention.prefill_attention(
        q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, sliding_window
    )


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Stores each token's K/V into its slot (block_id * block_size + offset), in place."""
    if _backend.use_triton(k.device):
        from . import triton_kv

        triton_kv.write_kv(k, v, k_cache, v_cache, slot_mapping)
        return
    torch_kv.write_kv(k, v, k_cache, v_cache, slot_mapping)


def copy_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_ids: torch.Tensor | Sequence[int],
    dst_ids: torch.Tensor | Sequence[int],
    dim: int = 0,
) -> None:
    """`dst[.., dst_ids, ..] = src[.., src_ids, ..]` along block dim `dim`; devices may differ."""
    src_index = _as_index(src_ids, src.device)
    dst_index = _as_index(dst_ids, dst.device)
    same_device_pools = src.device == dst.device and src.is_contiguous() and dst.is_contiguous()
    if same_device_pools and _backend.use_triton(src.device):
        from . import triton_kv

        triton_kv.copy_blocks(src, dst, src_index, dst_index, dim)
        return
    torch_kv.copy_blocks(src, dst, src_index, dst_index, dim)


def _as_index(ids: torch.Tensor | Sequence[int], device: torch.device) -> torch.Tensor:
    if isinstance(ids, torch.Tensor):
        return ids
    return torch.tensor(list(ids), dtype=torch.long, device=device)
