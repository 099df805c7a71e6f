"""What each timed part of a model step must move and compute: the bounds its time is judged by.

Counted from the arguments the profile's timers see (bench/offline/profile.py), as the least any
implementation could do: every weight read once, every visible key and value read once, every
activation read and written once. A part's floor is the larger of its bytes over the host's
measured copy bandwidth and its flops over the host's measured matmul peak (bench/offline/
bounds.py); its time over that floor says how far from the hardware it runs. Parts with a floor
of microseconds and a time of milliseconds are bound by per-call overhead, not by the machine.

Conventions: a multiply-add is 2 flops; an int8 weight or KV element counts 1 byte (its scales
are left out: a few percent); attention counts QK^T and PV (4 flops per query, visible key and
head dimension), softmax left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdserve.core.model.gemm import LinearWeight, weight_bytes
from pdserve.kernels import DecodePlan


@dataclass(frozen=True)
class Work:
    bytes: int
    flops: int


def linear_work(x: torch.Tensor, layer: LinearWeight) -> Work:
    """`rows x in -> rows x out`: the weight once, the rows in and out."""
    out_features, in_features = layer.features
    rows = x.shape[0]
    extras = sum(t.nbytes for t in (layer.bias, layer.scales) if t is not None)
    activations = rows * (in_features + out_features) * x.element_size()
    return Work(weight_bytes(layer) + extras + activations, 2 * rows * in_features * out_features)


def decode_attention_work(q: torch.Tensor, k_cache: torch.Tensor, plan: DecodePlan) -> Work:
    """One query per sequence over its visible keys (the window's, under a sliding window)."""
    lengths = plan.context_lens.tolist()
    window = plan.sliding_window
    visible = sum(length if window is None else min(length, window) for length in lengths)
    return _attention_work(q, k_cache, keys_read=visible, query_key_pairs=visible)


def prefill_attention_work(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    sliding_window: int | None,
) -> Work:
    """Each chunk's queries over the keys each may see (causal, windowed); each sequence's
    visible keys read once."""
    starts, lengths = query_start_loc.tolist(), context_lens.tolist()
    keys_read = pairs = 0
    for index, length in enumerate(lengths):
        num_queries = starts[index + 1] - starts[index]
        first = length - num_queries  # the chunk's first position
        for position in range(first, length):
            pairs += position + 1 if sliding_window is None else min(position + 1, sliding_window)
        lowest_seen = 0 if sliding_window is None else max(0, first - sliding_window + 1)
        keys_read += length - lowest_seen
    return _attention_work(q, k_cache, keys_read, pairs)


def _attention_work(
    q: torch.Tensor, k_cache: torch.Tensor, keys_read: int, query_key_pairs: int
) -> Work:
    num_kv_heads, head_dim = k_cache.shape[-2], k_cache.shape[-1]
    kv_bytes = 2 * keys_read * num_kv_heads * head_dim * k_cache.element_size()
    num_heads = q.shape[1]
    return Work(kv_bytes + 2 * q.nbytes, 4 * query_key_pairs * num_heads * head_dim)


def write_kv_work(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor) -> Work:
    """The step's new K and V read, and written into the cache."""
    written = (k.numel() + v.numel()) * k_cache.element_size()
    return Work(k.nbytes + v.nbytes + written, 0)


def rotary_work(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Work:
    """`x * cos + rotate(x) * sin`: x read and written, the step's cos and sin read."""
    return Work(2 * x.nbytes + cos.nbytes + sin.nbytes, 3 * x.numel())


def add_rms_norm_work(
    hidden: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, _eps: float
) -> Work:
    """The residual add (both read, the sum written), then squares, mean, scale and weight: the
    normalized rows written, the weight read."""
    added = 0 if residual is None else 2 * residual.nbytes
    return Work(
        2 * hidden.nbytes + added + weight.nbytes, (4 + (residual is not None)) * hidden.numel()
    )
