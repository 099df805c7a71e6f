"""Random paged-attention inputs with blocks scattered over the pool, and the checks against the
reference: shared by the tests (torch, interpreter, GPU) and the benchmark."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pdserve.kernels.reference import reference_decode, reference_prefill


@dataclass(frozen=True)
class PagedAttentionCase:
    """Inputs of one attention call; `query_start_loc` is None for decode (one query per seq)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_start_loc: torch.Tensor | None
    scale: float

    def to(self, device: torch.device | str) -> PagedAttentionCase:
        qsl = self.query_start_loc
        return PagedAttentionCase(
            self.q.to(device),
            self.k_cache.to(device),
            self.v_cache.to(device),
            self.block_tables.to(device),
            self.context_lens.to(device),
            None if qsl is None else qsl.to(device),
            self.scale,
        )


@dataclass(frozen=True)
class HeadConfig:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int


def make_paged_case(
    context_lens: list[int],
    heads: HeadConfig,
    dtype: torch.dtype = torch.float32,
    query_lens: list[int] | None = None,
    seed: int = 0,
) -> PagedAttentionCase:
    """K/V for every context token, stored in randomly permuted blocks of one pool.

    Block-table rows are padded with 0 past the used blocks, plus one spare padded column, as the
    model runner does. `query_lens=None` builds a decode batch (one query per sequence).
    """
    gen = torch.Generator().manual_seed(seed)
    bs = heads.block_size
    blocks_per_seq = [-(-length // bs) for length in context_lens]
    pool_blocks = sum(blocks_per_seq) + 3
    width = max(blocks_per_seq, default=0) + 1
    order = torch.randperm(pool_blocks, generator=gen).tolist()
    table = torch.zeros((len(context_lens), width), dtype=torch.int32)
    cursor = 0
    for seq, count in enumerate(blocks_per_seq):
        table[seq, :count] = torch.tensor(order[cursor : cursor + count], dtype=torch.int32)
        cursor += count
    cache_shape = (pool_blocks, bs, heads.num_kv_heads, heads.head_dim)
    k_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    v_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    num_queries = len(context_lens) if query_lens is None else sum(query_lens)
    q = torch.randn((num_queries, heads.num_heads, heads.head_dim), generator=gen).to(dtype)
    query_start_loc = None
    if query_lens is not None:
        starts = [0]
        for length in query_lens:
            starts.append(starts[-1] + length)
        query_start_loc = torch.tensor(starts, dtype=torch.int32)
    return PagedAttentionCase(
        q,
        k_cache,
        v_cache,
        table,
        torch.tensor(context_lens, dtype=torch.int32),
        query_start_loc,
        heads.head_dim**-0.5,
    )


# (atol, rtol) of any implementation against the fp32 reference computed from the same rounded
# inputs. fp32 differs only by summation order; fp16/bf16 are dominated by rounding the output to
# 11 / 8 mantissa bits (Triton's interpreter truncates bf16 stores, up to 2^-7 relative).
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    if actual.dtype != dtype:
        raise AssertionError(f"output dtype {actual.dtype}, expected {dtype}")
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.float().cpu(), expected, atol=atol, rtol=rtol)


def check_decode(
    decode: Callable[..., torch.Tensor], case: PagedAttentionCase, window: int | None
) -> None:
    """Runs `decode` on the case and asserts it matches the reference within TOLERANCES."""
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    out = decode(*args, sliding_window=window)
    if out.shape != case.q.shape:
        raise AssertionError(f"decode output shape {tuple(out.shape)}")
    assert_matches(out, reference_decode(*args, sliding_window=window), case.q.dtype)


def check_prefill(
    prefill: Callable[..., torch.Tensor], case: PagedAttentionCase, window: int | None
) -> None:
    """Runs `prefill` on the case and asserts it matches the reference within TOLERANCES."""
    if case.query_start_loc is None:
        raise ValueError("case: a prefill case needs query_start_loc (build it with query_lens)")
    args = (
        case.q,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        case.query_start_loc,
        case.context_lens,
        case.scale,
    )
    out = prefill(*args, sliding_window=window)
    if out.shape != case.q.shape:
        raise AssertionError(f"prefill output shape {tuple(out.shape)}")
    assert_matches(out, reference_prefill(*args, sliding_window=window), case.q.dtype)
