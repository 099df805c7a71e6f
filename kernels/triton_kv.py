# Triton kernel signatures are DSL values (pointers, constexprs), not Python types:
# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton write_kv and copy_blocks for device-resident pools (one launch each, any block count)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._backend import require_triton_device
from ._checks import check_copy_blocks_args, check_write_kv_args

COPY_CHUNK = 1024


@triton.jit
def write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_c_token,
    stride_c_head,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token of a captured batch: nothing to store
        return
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    mask = (heads[:, None] < KV_HEADS) & (dims[None, :] < HEAD_DIM)
    # The cache is contiguous, so a flat slot addresses block_id * block_size + offset directly.
    dst = slot * stride_c_token + heads[:, None] * stride_c_head + dims[None, :]
    row = token.to(tl.int64)
    k = tl.load(k_ptr + row * stride_k_token + heads[:, None] * stride_k_head + dims[None, :], mask)
    v = tl.load(v_ptr + row * stride_v_token + heads[:, None] * stride_v_head + dims[None, :], mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


@triton.jit
def copy_blocks_kernel(
    src_ptr,
    dst_ptr,
    src_ids_ptr,
    dst_ids_ptr,
    src_blocks,
    dst_blocks,
    block_numel,
    CHUNK: tl.constexpr,
):
    pair = tl.program_id(0)
    outer = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2)
    src_block = tl.load(src_ids_ptr + pair).to(tl.int64)
    dst_block = tl.load(dst_ids_ptr + pair).to(tl.int64)
    offsets = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offsets < block_numel
    values = tl.load(src_ptr + (outer * src_blocks + src_block) * block_numel + offsets, mask=mask)
    tl.store(dst_ptr + (outer * dst_blocks + dst_block) * block_numel + offsets, values, mask=mask)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Same contract as `pdserve.kernels.write_kv`; slots are not range-checked (no device sync),
    negative slots are skipped."""
    check_write_kv_args(k, v, k_cache, v_cache, slot_mapping)
    require_triton_device(k, "k")
    if k.shape[0] == 0:
        return
    if k.stride(2) != 1 or v.stride(2) != 1:
        k, v = k.contiguous(), v.contiguous()
    kv_heads, head_dim = k.shape[1], k.shape[2]
    write_kv_kernel[(k.shape[0],)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(kv_heads),
        HEAD_PAD=triton.next_power_of_2(head_dim),
    )


def copy_blocks(
    src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor, dim: int
) -> None:
    """`dst[.., dst_ids, ..] = src[.., src_ids, ..]` along `dim`; both contiguous, same device."""
    check_copy_blocks_args(src, dst, src_ids, dst_ids, dim)
    require_triton_device(src, "src")
    if dst.device != src.device or not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("dst: the Triton copy needs contiguous src and dst on one device")
    if src_ids.numel() == 0:
        return
    outer = math.prod(src.shape[:dim])
    block_numel = math.prod(src.shape[dim + 1 :])
    grid = (src_ids.numel(), outer, triton.cdiv(block_numel, COPY_CHUNK))
    copy_blocks_kernel[grid](
        src,
        dst,
        src_ids.to(src.device),
        dst_ids.to(src.device),
        src.shape[dim],
        dst.shape[dim],
        block_numel,
        CHUNK=COPY_CHUNK,
    )
