"""Triton kernels under Triton's interpreter, against the reference (small shapes: it is slow).

Not collected by a plain `pytest` run (the file name does not match test_*): test_triton_interpreter
runs it in a subprocess with TRITON_INTERPRET=1, which must be set before triton is imported and
must not leak into the rest of the session. Direct use:
    TRITON_INTERPRET=1 .venv/bin/pytest -q tests/kernels/interpreter_cases.py
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from pdserve.kernels import (
    copy_blocks,
    paged_attention_decode,
    paged_attention_prefill,
    torch_decode,
    triton_decode,
    write_kv,
)
from pdserve.kernels._backend import use_triton
from pdserve.kernels.kv_quant import quantize
from pdserve.testing.kernel_cases import HeadConfig, check_decode, check_prefill, make_paged_case

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 before triton is imported", allow_module_level=True)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def test_cpu_tensors_dispatch_to_the_interpreter() -> None:
    assert use_triton(torch.device("cpu"))


def test_int8_caches_take_the_torch_path_where_triton_runs() -> None:
    """The Triton kernels read float caches only; int8 ones must never reach them (a Triton
    kernel given int8 rows of head_dim + 4 would refuse or misread them)."""
    assert not use_triton(torch.device("cpu"), int8_kv=True)
    case = make_paged_case([33, 2], HeadConfig(9, 3, 64, 16))
    k8, v8 = quantize(case.k_cache), quantize(case.v_cache)
    args = (case.block_tables, case.context_lens, case.scale)
    out = paged_attention_decode(case.q, k8, v8, *args)
    expected = torch_decode.decode_attention(case.q, k8, v8, *args)
    assert torch.equal(out, expected)
    write_kv(case.q[:, :3], case.q[:, :3], k8, v8, torch.tensor([0, 1]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "window", "splits"),
    [
        (HeadConfig(8, 2, 64, 16), None, None),
        (HeadConfig(9, 3, 64, 32), 7, None),
        (HeadConfig(4, 4, 128, 16), None, 3),
        (HeadConfig(12, 4, 64, 16), 40, 2),
    ],
)
def test_decode(dtype: torch.dtype, heads: HeadConfig, window: int | None, splits: int) -> None:
    case = make_paged_case([1, 15, 16, 17, 70], heads, dtype, seed=heads.num_heads)
    decode = functools.partial(triton_decode.decode_attention, num_splits=splits)
    check_decode(decode, case, window)


def test_decode_through_the_dispatcher() -> None:
    case = make_paged_case([33, 2], HeadConfig(9, 3, 64, 16))
    check_decode(paged_attention_decode, case, None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("heads", "window"),
    [(HeadConfig(8, 2, 64, 16), None), (HeadConfig(9, 3, 64, 32), 9)],
)
def test_prefill(dtype: torch.dtype, heads: HeadConfig, window: int | None) -> None:
    # Chunks: whole prompt, a later chunk, one token, an empty chunk, a chunk over two tiles.
    case = make_paged_case(
        [16, 40, 17, 5, 90], heads, dtype, query_lens=[16, 7, 1, 0, 70], seed=heads.num_heads
    )
    check_prefill(paged_attention_prefill, case, window)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_and_copy_blocks_move_exact_bits(dtype: torch.dtype) -> None:
    k_cache = torch.zeros(4, 16, 3, 64, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(3, 3, 64).to(dtype)
    v = torch.randn(3, 3, 64).to(dtype)
    write_kv(k, v, k_cache, v_cache, torch.tensor([63, 0, 17]))
    assert torch.equal(k_cache[3, 15], k[0]) and torch.equal(v_cache[0, 0], v[1])
    assert torch.equal(k_cache[1, 1], k[2])
    assert k_cache.count_nonzero() == k.count_nonzero()

    whole = torch.stack([k_cache, v_cache]).unsqueeze(0)  # [layers, 2, blocks, ...]
    copy = torch.zeros_like(whole)
    copy_blocks(whole, copy, [3, 0], [1, 2], dim=2)
    assert torch.equal(copy[:, :, 1], whole[:, :, 3]) and torch.equal(copy[:, :, 2], whole[:, :, 0])
    assert not copy[:, :, [0, 3]].any()
