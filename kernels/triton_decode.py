# Triton kernel signatures are DSL values (pointers, constexprs), not Python types:
# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton decode attention over paged K/V (one query per sequence), split-K when the batch is small.

Program (seq, kv_head, split): the GQA group's query heads are the rows of one `tl.dot`, padded to
16 rows (the smallest dot shape), so each K/V tile is read once per group. Tokens are walked in
tiles of TILE through the block table with an online (log2-domain) softmax. When seqs x kv_heads
is too few programs to fill the GPU, each sequence's tokens are split across programs that write
partial (max, sum, acc) rows, and a second kernel merges them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._backend import TRITON_INTERPRET, require_triton_device
from ._checks import check_attention_args, check_decode_q
from .triton_common import LOG2E, NO_WINDOW, attend_tile, load_kv_tile, load_scaled_q

TILE = 64


@triton.jit
def decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    scale_log2e,
    sliding_window,
    split_len,
    num_splits,
    stride_q_seq,
    stride_q_head,
    stride_c_block,
    stride_c_token,
    stride_c_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    DOT_FP32: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    first = tl.maximum(context_len - sliding_window, 0) + split * split_len
    last = tl.minimum(context_len, first + split_len)

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_PAD)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    q_ptrs = q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :]
    q = load_scaled_q(q_ptrs, row_ok[:, None] & dim_ok[None, :], scale_log2e, k_cache_ptr, DOT_FP32)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)  # noqa: E741
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    head_offset = kv_head.to(tl.int64) * stride_c_head
    table_row = block_tables_ptr + seq * stride_bt_seq
    for start in range(first, last, TILE):
        tokens = start + tl.arange(0, TILE)
        token_ok = tokens < last
        k, v = load_kv_tile(
            k_cache_ptr,
            v_cache_ptr,
            table_row,
            tokens,
            token_ok,
            head_offset,
            dims,
            dim_ok,
            stride_c_block,
            stride_c_token,
            BLOCK_SIZE,
            DOT_FP32,
        )
        m, l, acc = attend_tile(q, k, v, token_ok[None, :], m, l, acc)  # noqa: E741

    if SINGLE_SPLIT:
        out = acc / l[:, None]
        out_ptrs = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    else:
        part = ((seq * (GROUP * tl.num_programs(1)) + heads) * num_splits + split).to(tl.int64)
        tl.store(part_m_ptr + part, m, mask=row_ok)
        tl.store(part_l_ptr + part, l, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * HEAD_PAD + dims[None, :], acc, mask=row_ok[:, None])


@triton.jit
def merge_splits_kernel(
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    num_splits,
    stride_o_seq,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_PAD)
    split_ok = splits < num_splits
    part = (seq * tl.num_programs(1) + head).to(tl.int64) * num_splits + splits
    m = tl.load(part_m_ptr + part, mask=split_ok, other=float("-inf"))
    l = tl.load(part_l_ptr + part, mask=split_ok, other=0.0)  # noqa: E741
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_PAD + dims[None, :], mask=split_ok[:, None])
    # Splits past a short context never ran a tile: m = -inf, weight 0.
    weight = tl.exp2(m - tl.max(m, 0))
    out = tl.sum(weight[:, None] * acc, 0) / tl.sum(weight * l, 0)
    out_ptrs = out_ptr + seq * stride_o_seq + head * stride_o_head + dims
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def group_pad(group: int) -> int:
    return max(16, int(triton.next_power_of_2(group)))


def choose_splits(num_programs: int, max_tokens: int, device: torch.device) -> int:
    """Enough splits for ~2 programs per SM, never a split shorter than one tile."""
    if device.type != "cuda":
        return 1
    target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    wanted = -(-target // max(num_programs, 1))
    return max(1, min(wanted, -(-max_tokens // TILE)))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Same contract as `paged_attention_decode`; lengths are not checked against the tables
    (that would cost a device sync). `num_splits` overrides the split-K choice (tests)."""
    shape = check_attention_args(
        q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window
    )
    check_decode_q(q, shape)
    require_triton_device(q, "q")
    if k_cache.stride(3) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache: the Triton kernel needs a contiguous head_dim and equal strides")
    q = q.contiguous()
    out = torch.empty_like(q)
    if shape.num_seqs == 0:
        return out
    window = NO_WINDOW if sliding_window is None else sliding_window
    max_tokens = min(shape.max_blocks_per_seq * shape.block_size, window)
    splits = num_splits or choose_splits(shape.num_seqs * shape.num_kv_heads, max_tokens, q.device)
    split_len = -(-max_tokens // splits // TILE) * TILE
    splits = max(1, -(-max_tokens // split_len))
    head_pad = triton.next_power_of_2(shape.head_dim)
    part_rows = (shape.num_seqs, shape.num_heads, splits)
    part_m = q.new_empty(part_rows, dtype=torch.float32) if splits > 1 else out
    part_l = q.new_empty(part_rows, dtype=torch.float32) if splits > 1 else out
    part_acc = q.new_empty((*part_rows, head_pad), dtype=torch.float32) if splits > 1 else out
    decode_kernel[(shape.num_seqs, shape.num_kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_m,
        part_l,
        part_acc,
        scale * LOG2E,
        window,
        split_len,
        splits,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=shape.group_size,
        GROUP_PAD=group_pad(shape.group_size),
        HEAD_DIM=shape.head_dim,
        HEAD_PAD=head_pad,
        BLOCK_SIZE=shape.block_size,
        TILE=TILE,
        DOT_FP32=q.dtype == torch.float32 or TRITON_INTERPRET,
        SINGLE_SPLIT=splits == 1,
    )
    if splits > 1:
        merge_splits_kernel[(shape.num_seqs, shape.num_heads)](
            out,
            part_m,
            part_l,
            part_acc,
            splits,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=shape.head_dim,
            HEAD_PAD=head_pad,
            SPLITS_PAD=triton.next_power_of_2(splits),
        )
    return out
