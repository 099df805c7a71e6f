"""Argument checks shared by every implementation of the kernel ops.

Only O(1) checks (ranks, dtypes, sizes, devices) run here, because they run on every call of the
hot path. Checks that need the values of a device tensor (context lengths against the block table)
live with the torch implementations, which read those values anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_quant import head_dim_of, is_quantized, row_width

ATTENTION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class AttentionShape:
    """The sizes every paged-attention implementation needs, read from validated arguments."""

    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    max_blocks_per_seq: int

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head (GQA)."""
        return self.num_heads // self.num_kv_heads


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_index(name: str, tensor: torch.Tensor, rank: int, dtype: torch.dtype) -> None:
    require(tensor.dim() == rank, f"{name}: expected {rank} dims, got shape {tuple(tensor.shape)}")
    require(tensor.dtype == dtype, f"{name}: expected dtype {dtype}, got {tensor.dtype}")


def check_attention_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> AttentionShape:
    """Validates what decode and prefill share; returns the sizes."""
    require(q.dim() == 3, f"q: expected [tokens, heads, head_dim], got shape {tuple(q.shape)}")
    require(q.dtype in ATTENTION_DTYPES, f"q: unsupported dtype {q.dtype}")
    require(
        k_cache.dim() == 4,
        f"k_cache: expected [blocks, block_size, kv_heads, head_dim], got {tuple(k_cache.shape)}",
    )
    require(
        v_cache.shape == k_cache.shape,
        f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}",
    )
    require(
        v_cache.dtype == k_cache.dtype,
        f"v_cache: dtype {v_cache.dtype} differs from k_cache {k_cache.dtype}",
    )
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        require(
            cache.dtype == q.dtype or is_quantized(cache),
            f"{name}: dtype {cache.dtype} differs from q {q.dtype} (and is not int8)",
        )
        require(cache.device == q.device, f"{name}: on {cache.device}, q on {q.device}")
    _, block_size, num_kv_heads, _ = k_cache.shape
    head_dim = head_dim_of(k_cache)
    num_heads = q.shape[1]
    require(q.shape[2] == head_dim, f"q: head_dim {q.shape[2]} differs from k_cache {head_dim}")
    require(
        num_heads % num_kv_heads == 0,
        f"q: num_heads {num_heads} is not a multiple of k_cache num_kv_heads {num_kv_heads}",
    )
    _check_index("block_tables", block_tables, 2, torch.int32)
    _check_index("context_lens", context_lens, 1, torch.int32)
    num_seqs = context_lens.shape[0]
    require(
        block_tables.shape[0] == num_seqs,
        f"block_tables: {block_tables.shape[0]} rows, context_lens has {num_seqs} sequences",
    )
    for name, index in (("block_tables", block_tables), ("context_lens", context_lens)):
        require(index.device == q.device, f"{name}: on {index.device}, q on {q.device}")
    require(scale > 0.0, f"scale: must be positive, got {scale}")
    require(
        sliding_window is None or sliding_window >= 1,
        f"sliding_window: must be None or >= 1, got {sliding_window}",
    )
    return AttentionShape(
        num_seqs, num_heads, num_kv_heads, head_dim, block_size, block_tables.shape[1]
    )


def check_decode_q(q: torch.Tensor, shape: AttentionShape) -> None:
    require(
        q.shape[0] == shape.num_seqs,
        f"q: {q.shape[0]} queries, context_lens has {shape.num_seqs} sequences (decode: one each)",
    )


def check_query_start_loc(query_start_loc: torch.Tensor, q: torch.Tensor, num_seqs: int) -> None:
    _check_index("query_start_loc", query_start_loc, 1, torch.int32)
    require(
        query_start_loc.shape[0] == num_seqs + 1,
        f"query_start_loc: expected {num_seqs + 1} entries (num_seqs + 1), "
        f"got {query_start_loc.shape[0]}",
    )
    require(
        query_start_loc.device == q.device,
        f"query_start_loc: on {query_start_loc.device}, q on {q.device}",
    )


def check_context_lens(context_lens: list[int], max_blocks_per_seq: int, block_size: int) -> None:
    """Every length within what its block-table row holds: a kernel that trusts them reads no
    block the row does not name."""
    capacity = max_blocks_per_seq * block_size
    for seq, length in enumerate(context_lens):
        require(
            1 <= length <= capacity,
            f"context_lens[{seq}]: {length} is outside 1..{capacity} "
            f"(block_tables has {max_blocks_per_seq} blocks of {block_size})",
        )


def check_block_ids(block_tables: torch.Tensor, num_blocks: int) -> None:
    """Every id a block of the cache: for a kernel that reads where the table points without
    bounds checks (one reduction a step, not a layer)."""
    if block_tables.numel() == 0:
        return
    low, high = int(block_tables.min()), int(block_tables.max())
    require(
        low >= 0 and high < num_blocks,
        f"block_tables: ids {low}..{high}, the cache has blocks 0..{num_blocks - 1}",
    )


def check_lengths(
    context_lens: list[int], query_lens: list[int] | None, shape: AttentionShape
) -> None:
    """Value checks, for implementations that hold the lengths on the host anyway."""
    check_context_lens(context_lens, shape.max_blocks_per_seq, shape.block_size)
    for seq, length in enumerate(context_lens):
        if query_lens is not None:
            require(
                0 <= query_lens[seq] <= length,
                f"query_start_loc: sequence {seq} has {query_lens[seq]} queries, "
                f"more than its context_lens {length} (or negative)",
            )


def check_write_kv_args(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    require(k.dim() == 3, f"k: expected [tokens, kv_heads, head_dim], got shape {tuple(k.shape)}")
    require(v.shape == k.shape, f"v: shape {tuple(v.shape)} differs from k {tuple(k.shape)}")
    require(k_cache.dim() == 4, f"k_cache: expected 4 dims, got shape {tuple(k_cache.shape)}")
    require(
        v_cache.shape == k_cache.shape,
        f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}",
    )
    quantized = is_quantized(k_cache)
    expected_rows = (k.shape[1], row_width(k.shape[2], quantized))
    require(
        tuple(k_cache.shape[2:]) == expected_rows,
        f"k: [kv_heads, head_dim] {tuple(k.shape[1:])} does not fit k_cache's [kv_heads, row] "
        f"{tuple(k_cache.shape[2:])} (expected {expected_rows}; an int8 row is head_dim + 4)",
    )
    cache_dtype = torch.int8 if quantized else k.dtype
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        require(cache.is_contiguous(), f"{name}: must be contiguous")
        require(cache.dtype == cache_dtype, f"{name}: dtype {cache.dtype}, expected {cache_dtype}")
        require(cache.device == k.device, f"{name}: on {cache.device}, k on {k.device}")
    require(v.dtype == k.dtype, f"v: dtype {v.dtype} differs from k {k.dtype}")
    _check_index("slot_mapping", slot_mapping, 1, torch.int64)
    require(
        slot_mapping.shape[0] == k.shape[0],
        f"slot_mapping: {slot_mapping.shape[0]} slots for {k.shape[0]} tokens",
    )
    require(slot_mapping.device == k.device, f"slot_mapping: on {slot_mapping.device}")


def check_copy_blocks_args(
    src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor, dim: int
) -> None:
    require(0 <= dim < src.dim(), f"dim: {dim} is not a dimension of src (rank {src.dim()})")
    require(dst.dim() == src.dim(), f"dst: rank {dst.dim()} differs from src {src.dim()}")
    for axis in range(src.dim()):
        require(
            axis == dim or src.shape[axis] == dst.shape[axis],
            f"dst: shape {tuple(dst.shape)} differs from src {tuple(src.shape)} "
            f"outside the block dim {dim}",
        )
    require(dst.dtype == src.dtype, f"dst: dtype {dst.dtype} differs from src {src.dtype}")
    for name, ids in (("src_ids", src_ids), ("dst_ids", dst_ids)):
        require(ids.dim() == 1, f"{name}: expected 1 dim, got shape {tuple(ids.shape)}")
        require(
            not ids.is_floating_point() and not ids.is_complex(),
            f"{name}: expected an integer tensor, got {ids.dtype}",
        )
    require(
        src_ids.shape[0] == dst_ids.shape[0],
        f"dst_ids: {dst_ids.shape[0]} ids, src_ids has {src_ids.shape[0]}",
    )
