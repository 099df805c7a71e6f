"""Kernel ops, one dispatching entry per op (see docs/kernels.md for the dispatch rules).

Which implementation runs is decided by `_backend.use_triton(device, int8_kv)`: Triton on CUDA
tensors, Triton's interpreter on CPU tensors only when TRITON_INTERPRET=1 (tests), torch otherwise
and for every int8 KV cache. The Triton modules are imported on first use, so CPU serving never
imports triton.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from . import _backend, cpu_decode, torch_attention, torch_decode, torch_kv
from ._checks import (
    check_attention_args,
    check_block_ids,
    check_context_lens,
    check_decode_q,
)
from .kv_quant import is_quantized

__all__ = [
    "DecodeBackend",
    "DecodePlan",
    "copy_blocks",
    "paged_attention_decode",
    "paged_attention_prefill",
    "plan_decode",
    "run_planned_decode",
    "write_kv",
]


class DecodeBackend(Enum):
    TRITON = "triton"
    CPU_KERNEL = "cpu_kernel"  # cpu_decode.cpp
    TORCH = "torch"


@dataclass(frozen=True)
class DecodePlan:
    """A decode step's attention metadata, prepared once and shared by every layer."""

    block_tables: torch.Tensor
    context_lens: torch.Tensor
    sliding_window: int | None
    backend: DecodeBackend
    torch_plan: torch_decode.TorchDecodePlan | None  # set where the torch path runs


def decode_backend(device: torch.device, dtype: torch.dtype, int8_kv: bool) -> DecodeBackend:
    """Triton on CUDA, the CPU kernel for float32 on the CPU where it is built, torch otherwise
    (`int8_kv`: the step's cache is int8, which only the torch path reads)."""
    if _backend.use_triton(device, int8_kv):
        return DecodeBackend.TRITON
    if cpu_decode.usable(dtype, device, int8_kv):
        return DecodeBackend.CPU_KERNEL
    return DecodeBackend.TORCH


def plan_decode(
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    sliding_window: int | None = None,
    int8_kv: bool = False,
    dtype: torch.dtype = torch.float32,
) -> DecodePlan:
    """Validates and prepares a step's decode metadata for queries of `dtype` (torch: per-bucket
    gather indices)."""
    backend = decode_backend(block_tables.device, dtype, int8_kv)
    torch_plan = None
    if backend is DecodeBackend.CPU_KERNEL:  # the kernel trusts the lengths: checked here
        check_context_lens(context_lens.tolist(), block_tables.shape[1], block_size)
    if backend is DecodeBackend.TORCH:
        torch_plan = torch_decode.plan_decode(
            block_tables, context_lens, block_size, sliding_window
        )
    return DecodePlan(block_tables, context_lens, sliding_window, backend, torch_plan)


def run_planned_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: DecodePlan,
    scale: float,
    checked: bool = False,
) -> torch.Tensor:
    """`paged_attention_decode` of one layer with the step's plan; `checked` as for `write_kv`."""
    if plan.backend is DecodeBackend.TRITON:
        from . import triton_decode

        return triton_decode.decode_attention(
            q, k_cache, v_cache, plan.block_tables, plan.context_lens, scale, plan.sliding_window
        )
    if not checked:
        shape = check_attention_args(
            q, k_cache, v_cache, plan.block_tables, plan.context_lens, scale, plan.sliding_window
        )
        check_decode_q(q, shape)
    if plan.backend is DecodeBackend.CPU_KERNEL:
        if not checked:
            check_block_ids(plan.block_tables, k_cache.shape[0])
        return cpu_decode.decode_attention(
            q, k_cache, v_cache, plan.block_tables, plan.context_lens, scale, plan.sliding_window
        )
    assert plan.torch_plan is not None  # planned for the torch path
    return torch_decode.run_decode(q, k_cache, v_cache, plan.torch_plan, scale)


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
    backend = decode_backend(q.device, q.dtype, is_quantized(k_cache))
    if backend is DecodeBackend.TRITON:
        from . import triton_decode

        return triton_decode.decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window
        )
    if backend is DecodeBackend.CPU_KERNEL:
        shape = check_attention_args(
            q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window
        )
        check_decode_q(q, shape)
        check_context_lens(context_lens.tolist(), shape.max_blocks_per_seq, shape.block_size)
        check_block_ids(block_tables, k_cache.shape[0])
        return cpu_decode.decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window
        )
    return torch_decode.decode_attention(
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
    if _backend.use_triton(q.device, is_quantized(k_cache)):
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
    checked: bool = False,
) -> None:
    """Stores each token's K/V into its slot (block_id * block_size + offset), in place.

    `checked=True` skips the argument checks: for callers that already passed the same step's
    arguments through once (the model checks in layer 0; every layer has the same shapes and
    slots). On the CPU those checks (a range reduction and a host sync) cost more than the copy.
    An int8 cache (last dim head_dim + 4) gets quantized rows with their scales (kv_quant).
    """
    if _backend.use_triton(k.device, is_quantized(k_cache)):
        from . import triton_kv

        triton_kv.write_kv(k, v, k_cache, v_cache, slot_mapping)
        return
    torch_kv.write_kv(k, v, k_cache, v_cache, slot_mapping, checked)


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
