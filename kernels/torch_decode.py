"""Paged decode attention in plain torch (the CPU serving path), planned once per step.

A decode step's metadata is the same in every layer, so `plan_decode` turns it into gather indices
once per step and `decode_attention` only gathers and attends per layer. The plan groups the
sequences into length buckets: each bucket gathers exactly the keys its sequences can see (token
slots, so a sliding window gathers only the window), padded to the bucket's longest, and runs one
`scaled_dot_product_attention` (torch's CPU flash kernel: it fuses the padding mask, softmax and
the GQA broadcast, and accumulates fp16/bf16 in fp32). The work per layer follows the tokens in
the batch, not `sequences x longest context` as a single padded gather did.

Sliding window `W`: the query at position `p` sees keys `p - W < k <= p` (HF / Mistral convention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._checks import check_attention_args, check_context_lens, check_decode_q
from .kv_quant import readable

# What one more bucket costs per layer (two gathers and one SDPA call more), in padded key tokens
# of gather + attention work: 192-384 timed best for 13 and 64 sequences of 10-300 tokens on 2
# cores (64 and 768 were slower by up to 1.6x at 64 sequences; docs/kernels.md).
BUCKET_OVERHEAD_TOKENS = 384


@dataclass(frozen=True)
class DecodeBucket:
    rows: torch.Tensor  # [seqs] int64: the bucket's sequences (rows of q)
    slots: torch.Tensor  # [seqs * padded_len] int64 flat cache slots, padding repeats a real key
    padded_len: int
    mask: torch.Tensor | None  # [seqs, 1, 1, padded_len] bool; None when nothing is padding


@dataclass(frozen=True)
class TorchDecodePlan:
    num_seqs: int
    buckets: tuple[DecodeBucket, ...]


def plan_decode(
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    sliding_window: int | None,
) -> TorchDecodePlan:
    """The per-step part of decode attention: validated lengths -> per-bucket gather indices."""
    lens = context_lens.tolist()
    check_context_lens(lens, block_tables.shape[1], block_size)
    visible = [length if sliding_window is None else min(length, sliding_window) for length in lens]
    order = sorted(range(len(lens)), key=lambda seq: -visible[seq])
    groups = bucket_groups([visible[seq] for seq in order])
    buckets = tuple(
        # Rows in their original order, so a single bucket's rows are q's rows as they are.
        _bucket(block_tables, sorted(order[i] for i in group), lens, visible, block_size)
        for group in groups
    )
    return TorchDecodePlan(len(lens), buckets)


def bucket_groups(lengths_desc: list[int]) -> list[range]:
    """Splits lengths sorted longest first into runs minimising padded tokens + bucket overhead
    (dynamic programming over the split points; a step has at most a few hundred sequences)."""
    n = len(lengths_desc)
    best = [0.0] + [float("inf")] * n  # best[i]: cost of the first i sequences
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(end):
            cost = best[start] + BUCKET_OVERHEAD_TOKENS + (end - start) * lengths_desc[start]
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups: list[range] = []
    end = n
    while end > 0:
        groups.append(range(cut[end], end))
        end = cut[end]
    return groups[::-1]


def _bucket(
    block_tables: torch.Tensor,
    seqs: list[int],
    lens: list[int],
    visible: list[int],
    block_size: int,
) -> DecodeBucket:
    device = block_tables.device
    padded_len = max(visible[seq] for seq in seqs)
    rows = torch.tensor(seqs, dtype=torch.long, device=device)
    seen = torch.tensor([visible[seq] for seq in seqs], device=device).unsqueeze(1)
    first = torch.tensor([lens[seq] - visible[seq] for seq in seqs], device=device).unsqueeze(1)
    offsets = torch.arange(padded_len, device=device).unsqueeze(0)
    # Padding positions repeat the sequence's last key: a valid slot, masked out below.
    positions = first + torch.minimum(offsets, seen - 1)
    blocks = block_tables.index_select(0, rows).long().gather(1, positions // block_size)
    slots = (blocks * block_size + positions % block_size).reshape(-1)
    padded = any(visible[seq] != padded_len for seq in seqs)
    mask = (offsets < seen)[:, None, None, :] if padded else None
    return DecodeBucket(rows, slots, padded_len, mask)


def run_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: TorchDecodePlan,
    scale: float,
) -> torch.Tensor:
    """One layer's decode attention with a step's plan: `[num_seqs, heads, dim]`."""
    if plan.num_seqs == 0:
        return torch.empty_like(q)
    keys_flat = k_cache.view(-1, *k_cache.shape[2:])
    values_flat = v_cache.view(-1, *v_cache.shape[2:])
    if len(plan.buckets) == 1:
        return _attend(q, keys_flat, values_flat, plan.buckets[0], scale)
    out = torch.empty_like(q)
    for bucket in plan.buckets:
        part = _attend(q.index_select(0, bucket.rows), keys_flat, values_flat, bucket, scale)
        out.index_copy_(0, bucket.rows, part)
    return out


def _attend(
    q: torch.Tensor,
    keys_flat: torch.Tensor,
    values_flat: torch.Tensor,
    bucket: DecodeBucket,
    scale: float,
) -> torch.Tensor:
    keys, values = (_gather(flat, bucket, q) for flat in (keys_flat, values_flat))
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=bucket.mask, scale=scale, enable_gqa=True
    )
    return out.squeeze(2)


def _gather(cache_flat: torch.Tensor, bucket: DecodeBucket, q: torch.Tensor) -> torch.Tensor:
    """The bucket's keys (or values) `[seqs, kv_heads, padded_len, dim]`, the layout SDPA wants,
    in q's dtype. An int8 cache is dequantized after the gather: the gather moves int8 bytes and
    only the bucket's rows are converted."""
    shape = (q.shape[0], bucket.padded_len, cache_flat.shape[1], q.shape[2])
    rows = readable(cache_flat.index_select(0, bucket.slots), q.dtype)
    return rows.view(shape).transpose(1, 2)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Plan and run in one call (tests, and the one-token chunks of a prefill step)."""
    shape = check_attention_args(
        q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window
    )
    check_decode_q(q, shape)
    plan = plan_decode(block_tables, context_lens, shape.block_size, sliding_window)
    return run_decode(q, k_cache, v_cache, plan, scale)
