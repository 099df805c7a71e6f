"""The INT8 KV row format: `head_dim` int8 values followed by their float32 scale's 4 bytes.

One row per (token, KV head), so an int8 cache is still one int8 tensor whose last dim is
`head_dim + 4`: a block carries its own scales, and whatever moves whole blocks (swap, transfer
staging, copy-on-write, the prefix cache) moves the scales with them without knowing they exist.

Why per-token-per-head scales (absmax / 127 of the row): a write never touches another row, so a
block that grows token by token is never re-quantized (a per-block scale would have to be raised,
and the block's earlier rows re-quantized, whenever a later token exceeds its max). The scale costs
4 bytes per `head_dim` values: 68 bytes per row for head_dim 64, vs 128 (fp16) or 256 (fp32).
"""

from __future__ import annotations

import torch

SCALE_NBYTES = 4  # one float32 after each row's int8 values
QMAX = 127  # symmetric: -127..127, so negating a row never overflows
# A row of zeros gets this scale (not 0), so dequantizing it gives zeros rather than 0 * inf.
_MIN_SCALE = torch.finfo(torch.float32).tiny


def is_quantized(cache: torch.Tensor) -> bool:
    """Whether a KV cache (or a gathered part of it) holds int8 rows with scales."""
    return cache.dtype == torch.int8


def row_width(head_dim: int, quantized: bool) -> int:
    """Elements in the last dim of the cache for heads of `head_dim` values."""
    return head_dim + SCALE_NBYTES if quantized else head_dim


def head_dim_of(cache: torch.Tensor) -> int:
    """The attention head size a cache holds (its last dim, less the scale when int8)."""
    return cache.shape[-1] - SCALE_NBYTES if is_quantized(cache) else cache.shape[-1]


def quantize(x: torch.Tensor) -> torch.Tensor:
    """`[..., head_dim]` floats -> `[..., head_dim + 4]` int8 rows (values, then the scale)."""
    as_float = x.float()
    scale = (as_float.abs().amax(-1, keepdim=True) / QMAX).clamp_min(_MIN_SCALE)
    values = torch.round(as_float / scale).clamp_(-QMAX, QMAX).to(torch.int8)
    return torch.cat([values, scale.view(torch.int8)], dim=-1)


def dequantize(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`[..., head_dim + 4]` int8 rows -> `[..., head_dim]` in `dtype` (multiplied in float32).

    The scale is read in place as a float32 view of the row's last 4 bytes: valid when head_dim
    is a multiple of 4 (offset and row stride stay 4-byte aligned; KVCache requires it)."""
    scale = rows[..., -SCALE_NBYTES:].view(torch.float32)
    # In place on the fresh float copy: one allocation fewer, which on the CPU is most of the
    # cost (fresh large buffers page-fault); int8 * float32 in one op took a slow path (14x).
    return rows[..., :-SCALE_NBYTES].float().mul_(scale).to(dtype)


def readable(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gathered cache rows as attention reads them: dequantized to `dtype` when int8, else as
    they are (a float cache already has the query's dtype)."""
    return dequantize(rows, dtype) if is_quantized(rows) else rows
