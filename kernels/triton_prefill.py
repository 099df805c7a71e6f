# Triton kernel signatures are DSL values (pointers, constexprs), not Python types:
# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton chunked-prefill attention over paged K/V (causal, optional sliding window).

Program (query tile, head, seq): BLOCK_M queries of one head of one sequence. The chunk's queries
are the last q_len positions of a context of context_len tokens (earlier chunks' K/V are already in
the cache), so query row i sits at position context_len - q_len + i and sees keys up to itself.
The grid is sized for the longest possible chunk (all of q's tokens); tiles past a sequence's own
chunk return at once, which costs little next to the attention itself.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._backend import TRITON_INTERPRET, require_triton_device
from ._checks import check_attention_args, check_query_start_loc
from .triton_common import LOG2E, NO_WINDOW, attend_tile, load_kv_tile, load_scaled_q


@triton.jit
def prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    context_lens_ptr,
    out_ptr,
    scale_log2e,
    sliding_window,
    stride_q_token,
    stride_q_head,
    stride_c_block,
    stride_c_token,
    stride_c_head,
    stride_bt_seq,
    stride_o_token,
    stride_o_head,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    context_len = tl.load(context_lens_ptr + seq)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    positions = context_len - q_len + rows
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD_DIM
    q_rows = (q_start + rows).to(tl.int64)
    q_ptrs = q_ptr + q_rows[:, None] * stride_q_token + head * stride_q_head + dims[None, :]
    q = load_scaled_q(q_ptrs, row_ok[:, None] & dim_ok[None, :], scale_log2e, k_cache_ptr, DOT_FP32)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)  # noqa: E741
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    head_offset = (head // GROUP).to(tl.int64) * stride_c_head
    first_position = context_len - q_len + tile * BLOCK_M
    first = tl.maximum(first_position - sliding_window + 1, 0)
    last = tl.minimum(context_len, first_position + BLOCK_M)
    table_row = block_tables_ptr + seq * stride_bt_seq
    for start in range(first, last, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < last
        k, v = load_kv_tile(
            k_cache_ptr,
            v_cache_ptr,
            table_row,
            keys,
            key_ok,
            head_offset,
            dims,
            dim_ok,
            stride_c_block,
            stride_c_token,
            BLOCK_SIZE,
            DOT_FP32,
        )
        distance = positions[:, None] - keys[None, :]
        visible = key_ok[None, :] & (distance >= 0) & (distance < sliding_window)
        m, l, acc = attend_tile(q, k, v, visible, m, l, acc)  # noqa: E741

    out = acc / tl.where(l > 0.0, l, 1.0)[:, None]
    out_ptrs = out_ptr + q_rows[:, None] * stride_o_token + head * stride_o_head + dims[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def tile_sizes(dtype: torch.dtype, head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): fp32 with wide heads takes narrower key tiles to stay in registers."""
    if dtype == torch.float32 and head_dim > 64:
        return 64, 32
    return 64, 64


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Same contract as `paged_attention_prefill`; lengths are not checked (no device sync)."""
    shape = check_attention_args(
        q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window
    )
    check_query_start_loc(query_start_loc, q, shape.num_seqs)
    require_triton_device(q, "q")
    if k_cache.stride(3) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache: the Triton kernel needs a contiguous head_dim and equal strides")
    q = q.contiguous()
    out = torch.empty_like(q)
    if shape.num_seqs == 0 or q.shape[0] == 0:
        return out
    block_m, block_n = tile_sizes(q.dtype, shape.head_dim)
    grid = (triton.cdiv(q.shape[0], block_m), shape.num_heads, shape.num_seqs)
    prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        context_lens,
        out,
        scale * LOG2E,
        NO_WINDOW if sliding_window is None else sliding_window,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=shape.group_size,
        HEAD_DIM=shape.head_dim,
        HEAD_PAD=triton.next_power_of_2(shape.head_dim),
        BLOCK_SIZE=shape.block_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_FP32=q.dtype == torch.float32 or TRITON_INTERPRET,
    )
    return out
