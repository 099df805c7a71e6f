"""write_kv and copy_blocks move bytes exactly."""

from __future__ import annotations

import pytest
import torch

from pdserve.kernels import copy_blocks, write_kv


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_write_kv_stores_each_token_at_its_slot(dtype: torch.dtype) -> None:
    num_blocks, block_size, kv_heads, head_dim = 6, 16, 3, 64
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([5 * 16 + 15, 0, 2 * 16 + 7, 17], dtype=torch.int64)
    k = torch.randn(4, kv_heads, head_dim).to(dtype)
    v = torch.randn(4, kv_heads, head_dim).to(dtype)
    write_kv(k, v, k_cache, v_cache, slots)
    for token, slot in enumerate(slots.tolist()):
        block, offset = divmod(slot, block_size)
        assert torch.equal(k_cache[block, offset], k[token])
        assert torch.equal(v_cache[block, offset], v[token])
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots] = True
    assert not k_cache.view(-1, kv_heads, head_dim)[~written].any()
    assert not v_cache.view(-1, kv_heads, head_dim)[~written].any()


def test_write_kv_into_per_layer_views_of_one_cache() -> None:
    cache = torch.zeros(2, 2, 4, 16, 2, 8)  # [layers, k/v, blocks, block_size, heads, dim]
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    write_kv(k, v, cache[1, 0], cache[1, 1], torch.tensor([3, 20, 63]))
    assert torch.equal(cache[1, 0, 1, 4], k[1])
    assert torch.equal(cache[1, 1, 3, 15], v[2])
    assert not cache[0].any()


def test_write_kv_with_no_tokens_is_a_no_op() -> None:
    cache = torch.zeros(2, 16, 1, 8)
    empty = torch.zeros(0, 1, 8)
    write_kv(empty, empty, cache, cache.clone(), torch.zeros(0, dtype=torch.int64))
    assert not cache.any()


def test_copy_blocks_along_dim_0() -> None:
    src = torch.randn(8, 16, 2, 4)
    dst = torch.zeros(5, 16, 2, 4)
    copy_blocks(src, dst, [7, 0, 3], [1, 4, 0])
    assert torch.equal(dst[1], src[7])
    assert torch.equal(dst[4], src[0])
    assert torch.equal(dst[0], src[3])
    assert not dst[[2, 3]].any()


def test_copy_blocks_along_block_dim_of_whole_cache() -> None:
    """Swap layout: block dim 2 of [layers, 2, blocks, block_size, heads, dim], bf16 bits intact."""
    gpu_pool = torch.randn(3, 2, 10, 16, 2, 8).to(torch.bfloat16)
    cpu_pool = torch.zeros(3, 2, 4, 16, 2, 8, dtype=torch.bfloat16)
    copy_blocks(gpu_pool, cpu_pool, torch.tensor([9, 2]), torch.tensor([3, 0]), dim=2)
    assert torch.equal(cpu_pool[:, :, 3], gpu_pool[:, :, 9])
    assert torch.equal(cpu_pool[:, :, 0], gpu_pool[:, :, 2])
    back = torch.zeros_like(gpu_pool)
    copy_blocks(cpu_pool, back, [3], [5], dim=2)
    assert torch.equal(back[:, :, 5], gpu_pool[:, :, 9])
    assert not back[:, :, :5].any()


def test_copy_blocks_with_no_ids_is_a_no_op() -> None:
    dst = torch.zeros(2, 4)
    copy_blocks(torch.ones(2, 4), dst, [], [])
    assert not dst.any()
