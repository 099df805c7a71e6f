"""Triton kernels on a CUDA device against the reference. Run on a GPU machine with:

.venv/bin/pytest -q -m gpu tests/kernels/test_triton_gpu.py
"""

from __future__ import annotations

import functools

import pytest
import torch

from pdserve.kernels import copy_blocks, paged_attention_decode, paged_attention_prefill, write_kv
from pdserve.testing.kernel_cases import HeadConfig, check_decode, check_prefill, make_paged_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEADS = [
    HeadConfig(4, 4, 64, 16),
    HeadConfig(8, 2, 128, 16),
    HeadConfig(12, 4, 64, 32),
    HeadConfig(9, 3, 64, 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("window", [None, 100])
def test_decode(dtype: torch.dtype, heads: HeadConfig, window: int | None) -> None:
    edges = [1, heads.block_size - 1, heads.block_size, heads.block_size + 1, 300, 1000]
    case = make_paged_case(edges, heads, dtype, seed=heads.num_heads).to("cuda")
    check_decode(paged_attention_decode, case, window)


@pytest.mark.parametrize("splits", [1, 2, 7])
def test_decode_with_forced_splits(splits: int) -> None:
    from pdserve.kernels import triton_decode

    case = make_paged_case([5, 130, 700], HeadConfig(9, 3, 64, 16), torch.float16).to("cuda")
    check_decode(functools.partial(triton_decode.decode_attention, num_splits=splits), case, None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("window", [None, 50])
def test_prefill(dtype: torch.dtype, heads: HeadConfig, window: int | None) -> None:
    contexts, chunks = [16, 300, 77, 5, 513], [16, 130, 1, 0, 513]
    case = make_paged_case(contexts, heads, dtype, query_lens=chunks, seed=heads.num_heads)
    check_prefill(paged_attention_prefill, case.to("cuda"), window)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_and_copy_blocks(dtype: torch.dtype) -> None:
    cache = torch.zeros(2, 2, 8, 16, 3, 64, dtype=dtype, device="cuda")
    k = torch.randn(5, 3, 64, device="cuda").to(dtype)
    v = torch.randn(5, 3, 64, device="cuda").to(dtype)
    slots = torch.tensor([127, 0, 16, 33, 64], device="cuda")
    write_kv(k, v, cache[1, 0], cache[1, 1], slots)
    expected = torch.zeros_like(cache)
    expected[1, 0].view(-1, 3, 64)[slots] = k
    expected[1, 1].view(-1, 3, 64)[slots] = v
    assert torch.equal(cache, expected)

    on_device = torch.zeros_like(cache)
    copy_blocks(cache, on_device, [7, 0], [0, 5], dim=2)
    assert torch.equal(on_device[:, :, 0], cache[:, :, 7])
    assert torch.equal(on_device[:, :, 5], cache[:, :, 0])
    swapped = torch.zeros(2, 2, 3, 16, 3, 64, dtype=dtype)
    copy_blocks(cache, swapped, torch.tensor([2, 4]), torch.tensor([0, 2]), dim=2)
    assert torch.equal(swapped[:, :, 2], cache[:, :, 4].cpu())
