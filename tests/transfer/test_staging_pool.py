"""The staging pool hands out idle buffers by size; with several idle it must not compare them."""

from __future__ import annotations

import torch

from pdserve.core.kv.cache import KVLayout
from pdserve.core.transfer.staging import StagingPool

LAYOUT = KVLayout(num_layers=2, num_kv_heads=1, head_dim=8, block_size=4, dtype="float32")


def test_acquire_picks_the_smallest_fitting_buffer_among_several() -> None:
    pool = StagingPool(max_pooled_bytes=1 << 20)
    small, large = pool.acquire(LAYOUT, 1, 1), pool.acquire(LAYOUT, 4, 1)
    pool.release(small)
    pool.release(large)  # two idle buffers of different sizes

    tiny = pool.acquire(LAYOUT, 1, 1)  # both fit; the smaller one, listed after the larger, wins
    assert tiny.memory.data_ptr() == small.memory.data_ptr()
    medium = pool.acquire(LAYOUT, 2, 1)
    assert medium.memory.data_ptr() == large.memory.data_ptr()
    assert pool.idle_bytes == 0


def test_same_size_buffers_are_handed_out_once_each() -> None:
    pool = StagingPool(max_pooled_bytes=1 << 20)
    first, second = pool.acquire(LAYOUT, 2, 1), pool.acquire(LAYOUT, 2, 1)
    pool.release(first)
    pool.release(second)
    taken = {pool.acquire(LAYOUT, 2, 1).memory.data_ptr() for _ in range(2)}
    assert taken == {first.memory.data_ptr(), second.memory.data_ptr()}


def test_idle_memory_is_reused_only_on_its_own_device() -> None:
    """Device staging (GPU tiers) and host staging share one pool: a host transfer must never be
    handed device memory, nor the other way round ("meta" stands in for a GPU here)."""
    pool = StagingPool(max_pooled_bytes=1 << 20)
    elsewhere = pool.acquire(LAYOUT, 4, 1, torch.device("meta"))
    assert elsewhere.memory.device.type == "meta"
    pool.release(elsewhere)
    on_host = pool.acquire(LAYOUT, 1, 1)
    assert on_host.memory.device.type == "cpu" and pool.idle_bytes == elsewhere.memory.numel()
    again = pool.acquire(LAYOUT, 1, 1, torch.device("meta"))
    assert again.memory is elsewhere.memory and pool.idle_bytes == 0
