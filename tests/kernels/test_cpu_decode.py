"""The CPU decode attention kernel (kernels/cpu_decode.cpp) against the per-sequence reference, at
the model's shapes and beyond, and the dispatch that picks it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve.kernels import DecodeBackend, cpu_decode, paged_attention_decode, plan_decode
from pdserve.testing.kernel_cases import HeadConfig, check_decode, make_paged_case
from tests.kernels.built import built_kernel

SMOLLM2 = HeadConfig(9, 3, 64, 16)  # the default model: 9 query heads over 3 KV heads


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    built_kernel(cpu_decode.kernel)


@pytest.mark.parametrize(
    "lengths",
    [
        [1],  # batch 1, the first decode step of a one-token prompt
        [87],  # batch 1, a block and a part
        [15, 16, 17, 32, 33, 300, 1, 2],  # ragged: block edges in one step
        list(range(5, 500, 31)),  # 16 sequences, every length different
        [4000],  # the longest context the tests reach
    ],
)
@pytest.mark.parametrize("window", [None, 64, 300])  # 300: a window over two pieces
def test_model_shapes(lengths: list[int], window: int | None) -> None:
    case = make_paged_case(lengths, SMOLLM2, seed=len(lengths))
    check_decode(cpu_decode.decode_attention, case, window)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    heads=st.sampled_from([(4, 4), (8, 2), (12, 4), (9, 3)]),
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([16, 32]),
    window=st.none() | st.integers(1, 80),
    seed=st.integers(0, 1000),
)
def test_matches_reference(
    lens: list[int],
    heads: tuple[int, int],
    head_dim: int,
    block_size: int,
    window: int | None,
    seed: int,
) -> None:
    case = make_paged_case(lens, HeadConfig(*heads, head_dim, block_size), seed=seed)
    check_decode(cpu_decode.decode_attention, case, window)


def test_a_block_id_outside_the_cache_is_refused_before_the_kernel_reads() -> None:
    case = make_paged_case([40, 20], SMOLLM2)
    tables = case.block_tables.clone()
    tables[1, 0] = case.k_cache.shape[0]  # one past the last block
    with pytest.raises(ValueError, match=r"^block_tables: ids"):
        paged_attention_decode(
            case.q, case.k_cache, case.v_cache, tables, case.context_lens, case.scale
        )


def _backend(dtype: torch.dtype, int8_kv: bool = False) -> DecodeBackend:
    tables, lengths = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    return plan_decode(tables, lengths, 16, int8_kv=int8_kv, dtype=dtype).backend


def test_float32_runs_the_kernel_and_the_rest_runs_torch() -> None:
    assert _backend(torch.float32) is DecodeBackend.CPU_KERNEL
    assert _backend(torch.bfloat16) is DecodeBackend.TORCH
    assert _backend(torch.float32, int8_kv=True) is DecodeBackend.TORCH


@pytest.mark.usefixtures("cpu_kernels_off")
def test_the_switch_keeps_the_torch_path() -> None:
    assert _backend(torch.float32) is DecodeBackend.TORCH
