"""Short query chunks of many sequences in a few padded SDPA calls: the CPU path of speculative
verification, where every decoding sequence of a step brings its last token and its drafts
(1 + K query tokens) over its paged context.

Attending to them one sequence at a time (the prefill loop) costs one gather and one small SDPA
call per sequence and layer: Python and dispatch overhead that grows with the batch, not with
the work. Here the chunks are grouped by context length as decode groups its sequences
(`torch_decode.bucket_groups`); a group gathers each sequence's keys once, padded to the
group's longest context, and runs one SDPA over queries padded to the group's longest chunk,
with a mask that is causal inside each chunk. Padding query rows repeat a chunk's last query and
are dropped; padding keys repeat a real key and are masked out.

Full attention only: with a sliding window a sequence's block table may hold no real block
before its first query's window, which a padded gather would read (the prefill loop handles it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .kv_quant import readable
from .torch_decode import bucket_groups

# Query tokens of a chunk this path takes: a decode and its drafts (speculation verifies 1 + K,
# K = 4 by default), with room for larger K. Longer chunks are prompt chunks: the prefill loop.
MAX_SHORT_CHUNK_TOKENS = 16


def attend_short_chunks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    chunks: list[tuple[int, int, int, int]],
    scale: float,
    out: torch.Tensor,
) -> None:
    """Writes into `out` the attention of each chunk `(seq, first_row, query_len, context_len)`:
    rows `first_row .. first_row + query_len` of `q`, the last tokens of `seq`'s context."""
    by_context = sorted(chunks, key=lambda chunk: -chunk[3])
    for group in bucket_groups([chunk[3] for chunk in by_context]):
        _attend_group(
            q, k_cache, v_cache, block_tables, by_context[group.start : group.stop], scale, out
        )


def _attend_group(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    chunks: list[tuple[int, int, int, int]],
    scale: float,
    out: torch.Tensor,
) -> None:
    device = q.device
    count, block_size = len(chunks), k_cache.shape[1]
    seqs, first_rows, query_lens, context_lens = (
        torch.tensor(column, device=device).unsqueeze(1) for column in zip(*chunks, strict=True)
    )
    query_index = torch.arange(max(chunk[2] for chunk in chunks), device=device).unsqueeze(0)
    last_query = torch.minimum(query_index, query_lens - 1)  # padding repeats the last query
    rows = first_rows + last_query  # [count, longest chunk]
    queries = q.index_select(0, rows.reshape(-1)).view(count, -1, *q.shape[1:]).transpose(1, 2)
    key_index = torch.arange(max(chunk[3] for chunk in chunks), device=device).unsqueeze(0)
    positions = torch.minimum(key_index, context_lens - 1)  # padding repeats the last key
    tables = block_tables.index_select(0, seqs.squeeze(1)).long()
    slots = (
        tables.gather(1, positions // block_size) * block_size + positions % block_size
    ).reshape(-1)
    keys, values = (
        readable(cache.view(-1, *cache.shape[2:]).index_select(0, slots), q.dtype)
        .view(count, -1, cache.shape[2], q.shape[2])  # an int8 row's scale is gone now
        .transpose(1, 2)
        for cache in (k_cache, v_cache)
    )
    # Query i of a chunk sits at position context_len - query_len + i and sees the keys up to it.
    query_positions = context_lens - query_lens + last_query
    mask = (key_index.unsqueeze(1) <= query_positions.unsqueeze(2)).unsqueeze(1)
    attended = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    ).transpose(1, 2)  # [count, longest chunk, heads, dim]
    real = query_index < query_lens
    out.index_copy_(0, rows[real], attended[real])
