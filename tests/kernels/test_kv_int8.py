"""The INT8 KV cache's kernels: the row format, writes, and attention over dequantized rows.

Two claims, tested separately. (1) Attention over an int8 cache is exactly attention over the
dequantized cache (the fp32 reference on `dequantize(quantize(K))` within fp32 tolerance): the
kernels read the rows right. (2) The quantization error is bounded: each value is off by at most
half a step (absmax / 254 of its row), the attention output by at most what those errors can move
it (`_output_bound`, derived there), and on average by no more than rounding predicts
(`_typical_error`).
"""

from __future__ import annotations

import math

import pytest
import torch

from pdserve.kernels import paged_attention_decode, paged_attention_prefill, write_kv
from pdserve.kernels.kv_quant import QMAX, SCALE_NBYTES, dequantize, head_dim_of, quantize
from pdserve.kernels.reference import reference_decode, reference_prefill
from pdserve.testing.kernel_cases import HeadConfig, PagedAttentionCase, make_paged_case

HEADS = HeadConfig(num_heads=9, num_kv_heads=3, head_dim=64, block_size=16)
LENS = [1, 15, 16, 17, 100, 300]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_error_is_at_most_half_a_step(dtype: torch.dtype) -> None:
    x = (torch.randn(500, 3, 64, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    rows = quantize(x)
    assert rows.dtype == torch.int8 and rows.shape == (500, 3, 64 + SCALE_NBYTES)
    back = dequantize(rows, torch.float32)
    half_step = x.float().abs().amax(-1, keepdim=True) / (2 * QMAX)
    assert ((back - x.float()).abs() <= half_step * (1 + 1e-5)).all()
    assert dequantize(rows, dtype).dtype == dtype and head_dim_of(rows) == 64


def test_zero_rows_and_extremes_survive() -> None:
    x = torch.zeros(2, 1, 8)
    x[1, 0, 3] = -5.0  # the absmax value itself comes back exactly
    back = dequantize(quantize(x), torch.float32)
    assert torch.equal(back, x)


def test_write_kv_stores_quantized_rows_in_their_slots() -> None:
    gen = torch.Generator().manual_seed(2)
    k, v = torch.randn(5, 3, 64, generator=gen), torch.randn(5, 3, 64, generator=gen)
    k_cache = torch.zeros(4, 16, 3, 64 + SCALE_NBYTES, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([0, 1, 17, 40, 63])
    write_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, 3, 68), v_cache.view(-1, 3, 68)
    assert torch.equal(flat_k[slots], quantize(k)) and torch.equal(flat_v[slots], quantize(v))
    untouched = [s for s in range(64) if s not in slots.tolist()]
    assert not flat_k[untouched].any() and not flat_v[untouched].any()


def test_write_kv_refuses_a_cache_whose_rows_do_not_fit() -> None:
    k = torch.randn(1, 3, 64)
    cache = torch.zeros(4, 16, 3, 64, dtype=torch.int8)  # no room for the scale
    with pytest.raises(ValueError, match=r"^k: .*head_dim \+ 4"):
        write_kv(k, k, cache, cache.clone(), torch.tensor([0]))


def _quantized(case: PagedAttentionCase) -> PagedAttentionCase:
    return PagedAttentionCase(
        case.q,
        quantize(case.k_cache),
        quantize(case.v_cache),
        case.block_tables,
        case.context_lens,
        case.query_start_loc,
        case.scale,
    )


def _output_bound(case: PagedAttentionCase) -> float:
    """The most int8 rounding can move any attention output value.

    With key errors at most dk (half a step) each logit moves by eps <= scale * |q|_1 * dk, so each
    softmax weight by a factor in [e^-2eps, e^2eps]: the weights move by at most e^2eps - 1 in
    L1, which moves the output by at most that times max|v|. Value errors (at most dv) move a
    convex combination by at most dv. The bound is loose (errors do not all align) but it is a
    bound: an int8 kernel that read the wrong rows or scales breaks claim (1) instead.
    """
    dk = float(case.k_cache.abs().amax()) / (2 * QMAX)
    dv = float(case.v_cache.abs().amax()) / (2 * QMAX)
    eps = case.scale * float(case.q.abs().sum(-1).amax()) * dk
    return math.expm1(2 * eps) * float(case.v_cache.abs().amax()) + dv


def _typical_error(case: PagedAttentionCase) -> float:
    """The expected size of the output error, for a sharper check than the bound: one value's
    rounding error is uniform over a step, RMS `step / sqrt(12)` (step = absmax of its row / 127).
    An output is a convex combination of values, so the value errors move it by at most that RMS
    (independent errors average out); key errors move the weights by a comparable amount. The
    mean absolute error must stay under twice the mean value-error RMS (observed: a fifth of it).
    """
    steps = case.v_cache.abs().amax(-1) / QMAX
    return 2 * float(steps.mean()) / math.sqrt(12)


def _assert_rounding_error(
    out: torch.Tensor, original: torch.Tensor, case: PagedAttentionCase
) -> None:
    error = (out - original).abs()
    assert 0 < float(error.amax()) <= _output_bound(case)
    assert float(error.mean()) <= _typical_error(case)


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_over_int8_is_attention_over_the_dequantized_cache(
    window: int | None, dtype: torch.dtype
) -> None:
    case = make_paged_case(LENS, HEADS, dtype, seed=3)
    int8 = _quantized(case)
    out = paged_attention_decode(
        int8.q,
        int8.k_cache,
        int8.v_cache,
        int8.block_tables,
        int8.context_lens,
        int8.scale,
        sliding_window=window,
    )
    assert out.dtype == dtype
    dequantized = (dequantize(int8.k_cache, dtype), dequantize(int8.v_cache, dtype))
    args = (case.block_tables, case.context_lens, case.scale)
    exact = reference_decode(case.q, *dequantized, *args, sliding_window=window)
    tolerance = (
        1e-5 if dtype == torch.float32 else 1.6e-2
    )  # pdserve/testing/kernel_cases.py TOLERANCES
    torch.testing.assert_close(out.float(), exact, atol=tolerance, rtol=tolerance)
    if dtype == torch.float32:
        original = reference_decode(case.q, case.k_cache, case.v_cache, *args, window)
        _assert_rounding_error(out, original, case)


def test_prefill_over_int8_is_attention_over_the_dequantized_cache() -> None:
    query_lens = [1, 15, 1, 5, 40, 300]  # 15 and 5: short chunks, padded together
    case = make_paged_case(LENS, HEADS, query_lens=query_lens, seed=4)
    int8 = _quantized(case)
    assert int8.query_start_loc is not None and case.query_start_loc is not None
    args = (case.block_tables, case.query_start_loc, case.context_lens, case.scale)
    out = paged_attention_prefill(int8.q, int8.k_cache, int8.v_cache, *args)
    dequantized = (dequantize(int8.k_cache, torch.float32), dequantize(int8.v_cache, torch.float32))
    exact = reference_prefill(case.q, *dequantized, *args)
    torch.testing.assert_close(out, exact, atol=1e-5, rtol=1e-4)
    original = reference_prefill(case.q, case.k_cache, case.v_cache, *args)
    _assert_rounding_error(out, original, case)
