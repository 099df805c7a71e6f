# Triton kernel signatures are DSL values (pointers, constexprs), not Python types:
# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Pieces shared by the decode and prefill attention kernels (inlined by Triton at compile time).

All softmax work is in the log2 domain: q is pre-scaled by scale * log2(e), so exp2 replaces exp.
With DOT_FP32 (fp32 inputs, or the interpreter, whose bf16 `tl.dot` is wrong) K/V are cast to fp32
after the load and dots run in IEEE fp32 (no TF32); otherwise fp16/bf16 dots accumulate in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
NO_WINDOW = 1 << 30  # a window no context reaches: one kernel variant serves both cases


@triton.jit
def load_scaled_q(q_ptrs, mask, scale_log2e, k_cache_ptr, DOT_FP32: tl.constexpr):
    q = tl.load(q_ptrs, mask=mask, other=0.0).to(tl.float32) * scale_log2e
    if not DOT_FP32:
        q = q.to(k_cache_ptr.dtype.element_ty)
    return q


@triton.jit
def load_kv_tile(
    k_cache_ptr,
    v_cache_ptr,
    table_row_ptr,
    tokens,
    token_ok,
    head_offset,
    dims,
    dim_ok,
    stride_c_block,
    stride_c_token,
    BLOCK_SIZE: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """K and V of `tokens` ([TILE, HEAD_PAD]) through the sequence's block-table row."""
    block = tl.load(table_row_ptr + tokens // BLOCK_SIZE, mask=token_ok, other=0).to(tl.int64)
    offsets = block * stride_c_block + (tokens % BLOCK_SIZE) * stride_c_token + head_offset
    kv_mask = token_ok[:, None] & dim_ok[None, :]
    k = tl.load(k_cache_ptr + offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + offsets[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def attend_tile(q, k, v, visible, m, l, acc):  # noqa: E741
    """One online-softmax step: folds a K/V tile into the running (max, sum, acc) of each row."""
    scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    # A row may see no key of this tile (window, padding rows): keep exp2 away from -inf - -inf.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    l = l * alpha + tl.sum(p, 1)  # noqa: E741
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, l, acc
