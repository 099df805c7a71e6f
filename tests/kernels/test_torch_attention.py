"""Torch paged attention (the CPU path for what the CPU kernel does not run: bfloat16, float16,
int8 KV caches, no compiler) against the per-sequence reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve.kernels import (
    paged_attention_decode,
    paged_attention_prefill,
    torch_attention,
    torch_decode,
)
from pdserve.testing.kernel_cases import (
    TOLERANCES,
    HeadConfig,
    check_decode,
    check_prefill,
    make_paged_case,
)

HEAD_PAIRS = [(4, 4), (8, 2), (12, 4), (9, 3)]
DTYPES = list(TOLERANCES)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_at_block_edges(block_size: int, head_dim: int) -> None:
    edges = [1, block_size - 1, block_size, block_size + 1, 2 * block_size, 300]
    case = make_paged_case(edges, HeadConfig(8, 2, head_dim, block_size))
    check_decode(torch_decode.decode_attention, case, None)


lengths = st.lists(st.integers(1, 300), min_size=1, max_size=5)
windows = st.none() | st.integers(1, 80)


@settings(max_examples=40, deadline=None)
@given(
    lens=lengths,
    heads=st.sampled_from(HEAD_PAIRS),
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([16, 32]),
    dtype=st.sampled_from(DTYPES),
    window=windows,
    seed=st.integers(0, 1000),
)
def test_decode_matches_reference(
    lens: list[int],
    heads: tuple[int, int],
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    window: int | None,
    seed: int,
) -> None:
    case = make_paged_case(lens, HeadConfig(*heads, head_dim, block_size), dtype, seed=seed)
    check_decode(torch_decode.decode_attention, case, window)


@st.composite
def prefill_lengths(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """(context_lens, query_lens) with each chunk the last tokens of its sequence."""
    contexts = draw(st.lists(st.integers(1, 300), min_size=1, max_size=3))
    queries = [draw(st.integers(0, min(ctx, 64)) | st.just(ctx)) for ctx in contexts]
    return contexts, queries


@settings(max_examples=30, deadline=None)
@given(
    lens=prefill_lengths(),
    heads=st.sampled_from(HEAD_PAIRS),
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([16, 32]),
    dtype=st.sampled_from(DTYPES),
    window=windows,
    seed=st.integers(0, 1000),
)
def test_prefill_matches_reference(
    lens: tuple[list[int], list[int]],
    heads: tuple[int, int],
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    window: int | None,
    seed: int,
) -> None:
    contexts, queries = lens
    config = HeadConfig(*heads, head_dim, block_size)
    case = make_paged_case(contexts, config, dtype, query_lens=queries, seed=seed)
    check_prefill(paged_attention_prefill, case, window)


def test_decode_equals_last_row_of_prefill() -> None:
    """A decode step is a prefill chunk of one token: both paths must agree."""
    config = HeadConfig(9, 3, 64, 16)
    case = make_paged_case([40, 77], config, query_lens=[1, 1])
    assert case.query_start_loc is not None
    common = (case.q, case.k_cache, case.v_cache, case.block_tables)
    decode = paged_attention_decode(*common, case.context_lens, case.scale)
    prefill = paged_attention_prefill(*common, case.query_start_loc, case.context_lens, case.scale)
    torch.testing.assert_close(decode, prefill)


def test_prefill_batches_one_token_chunks_through_decode() -> None:
    """A mixed step: decode-like one-token chunks between real prefill chunks."""
    config = HeadConfig(9, 3, 64, 16)
    contexts, chunks = [40, 77, 20, 1, 300, 33], [1, 1, 20, 1, 64, 1]
    for window in (None, 10):
        case = make_paged_case(contexts, config, torch.float16, query_lens=chunks, seed=3)
        check_prefill(paged_attention_prefill, case, window)


@pytest.mark.parametrize("dtype", DTYPES)
def test_short_chunks_attend_together(dtype: torch.dtype) -> None:
    """A speculative verify step: decodes with their drafts (2-16 query tokens) over contexts
    of 2 to 600 tokens (two length buckets), beside one-token decodes and a prompt chunk."""
    contexts, chunks = [600, 5, 40, 77, 300, 33, 2, 590], [5, 5, 1, 3, 64, 1, 2, 16]
    assert torch_attention._short_chunks(chunks, {2, 5}, None) == [0, 1, 3, 6, 7]
    assert torch_attention._short_chunks(chunks, {2, 5}, 50) == []  # windows: the prefill loop
    case = make_paged_case(contexts, HeadConfig(9, 3, 64, 16), dtype, query_lens=chunks, seed=7)
    check_prefill(paged_attention_prefill, case, None)


@pytest.mark.parametrize("window", [None, 50])
def test_decode_in_several_length_buckets(window: int | None) -> None:
    """Long and short contexts in one step go into separate gather buckets; rows keep order."""
    contexts = [600, 3, 5, 590, 2, 4, 1]
    case = make_paged_case(contexts, HeadConfig(9, 3, 64, 16), seed=5)
    plan = torch_decode.plan_decode(case.block_tables, case.context_lens, 16, window)
    assert len(plan.buckets) == (1 if window else 2)
    assert sorted(int(row) for bucket in plan.buckets for row in bucket.rows) == list(range(7))
    check_decode(torch_decode.decode_attention, case, window)


def test_blocks_before_the_window_are_never_read() -> None:
    """A sliding window's table may hold no real block before its window (core/kv/sliding_window.py)
    poisoning every block wholly before the first query's window changes no output."""
    window, block = 20, 16
    contexts, chunks = [100, 77, 300, 40], [30, 1, 64, 1]
    case = make_paged_case(contexts, HeadConfig(9, 3, 64, block), query_lens=chunks, seed=7)
    assert case.query_start_loc is not None
    common = (case.q, case.k_cache, case.v_cache, case.block_tables)
    clean = paged_attention_prefill(
        *common, case.query_start_loc, case.context_lens, case.scale, window
    )
    for seq, (context, chunk) in enumerate(zip(contexts, chunks, strict=True)):
        first_block = (context - chunk - window + 1) // block
        for block_id in case.block_tables[seq, :first_block].tolist():
            case.k_cache[block_id] = float("nan")
            case.v_cache[block_id] = float("nan")
    poisoned = paged_attention_prefill(
        *common, case.query_start_loc, case.context_lens, case.scale, window
    )
    torch.testing.assert_close(poisoned, clean)
    decode_rows = case.query_start_loc[1].unsqueeze(0), case.query_start_loc[3].unsqueeze(0)
    picked = torch.tensor([1, 3])
    decoded = paged_attention_decode(
        case.q[torch.cat(decode_rows)],
        case.k_cache,
        case.v_cache,
        case.block_tables[picked],
        case.context_lens[picked],
        case.scale,
        window,
    )
    torch.testing.assert_close(decoded, clean[torch.cat(decode_rows).long()])
