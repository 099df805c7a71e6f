"""Plain reference attention: one sequence at a time, K/V gathered, then
F.scaled_dot_product_attention in fp32. Slow on purpose and obviously right; the tests and the
benchmark compare against it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _sequence_kv(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """`[kv_heads, context_len, dim]` in fp32, token by token through the block table."""
    block_size = cache.shape[1]
    positions = torch.arange(context_len)
    blocks = block_table.long().cpu()[positions // block_size]
    tokens = cache.cpu()[blocks, positions % block_size]
    return tokens.float().transpose(0, 1)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context_len: int,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    query_len = q.shape[0]
    query_pos = torch.arange(context_len - query_len, context_len).unsqueeze(1)
    key_pos = torch.arange(context_len).unsqueeze(0)
    mask = key_pos <= query_pos
    if sliding_window is not None:
        mask &= key_pos > query_pos - sliding_window
    out = F.scaled_dot_product_attention(
        q.cpu().float().transpose(0, 1), k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.transpose(0, 1)


def reference_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """fp32 result on the CPU, `[num_seqs, heads, dim]`."""
    outs = []
    for seq, context_len in enumerate(context_lens.tolist()):
        k = _sequence_kv(k_cache, block_tables[seq], context_len)
        v = _sequence_kv(v_cache, block_tables[seq], context_len)
        outs.append(_attend(q[seq : seq + 1], k, v, context_len, scale, sliding_window))
    return torch.cat(outs) if outs else q.cpu().float()


def reference_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """fp32 result on the CPU, `[num_tokens, heads, dim]`."""
    out = torch.zeros(q.shape, dtype=torch.float32)
    starts = query_start_loc.tolist()
    for seq, context_len in enumerate(context_lens.tolist()):
        rows = slice(starts[seq], starts[seq + 1])
        if starts[seq + 1] == starts[seq]:
            continue
        k = _sequence_kv(k_cache, block_tables[seq], context_len)
        v = _sequence_kv(v_cache, block_tables[seq], context_len)
        out[rows] = _attend(q[rows], k, v, context_len, scale, sliding_window)
    return out
