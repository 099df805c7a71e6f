"""The KV offload tiers alone (no model): the host tier's LRU slots, the disk tier's files (written
off the caller's thread, reused after a restart, every bad file dropped and never served), and the
pool -> tiers -> pool round trip through the KV-cache manager."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import BlockHash
from pdserve.core.kv.cache import KVCache, KVLayout
from pdserve.core.kv.disk_tier import HEADER, BlockShape, DiskTier
from pdserve.core.kv.host_tier import HostTier
from pdserve.core.kv.manager import KVCacheManager
from pdserve.core.kv.offload import KVOffload, OffloadTier
from pdserve.core.request import Request
from pdserve.core.sampling_params import SamplingParams
from pdserve.local.cluster import worker_folders

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype="float32")
BLOCK = BlockShape((2, 2, 4, 2, 4), torch.float32)


def key(index: int) -> BlockHash:
    return hashlib.blake2b(str(index).encode(), digest_size=16).digest()


def rows(value: float) -> torch.Tensor:
    return torch.full(BLOCK.shape, value)


def written(tier: DiskTier, count: int) -> None:
    """Waits until the writer has landed `count` blocks (it runs on its own thread)."""
    tier.close()
    assert tier.stats.written_blocks == count


def test_host_tier_keeps_the_most_recent_blocks_and_hands_back_the_one_it_displaces() -> None:
    host = HostTier(LAYOUT, num_blocks=2, pin_memory=False)
    assert host.store(key(0), rows(0.0)) is None
    assert host.store(key(1), rows(1.0)) is None
    host.touch(key(0))  # now 1 is the least recently used
    displaced = host.store(key(2), rows(2.0))
    assert displaced is not None
    assert displaced[0] == key(1) and torch.equal(displaced[1], rows(1.0))
    loaded = host.load(key(0))
    assert loaded is not None and torch.equal(loaded, rows(0.0))
    assert key(1) not in host and host.load(key(1)) is None


def test_disk_tier_reads_back_what_it_wrote_after_a_restart(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, capacity_blocks=8, block=BLOCK)
    for index in range(3):
        tier.store(key(index), rows(float(index)))
    written(tier, 3)
    again = DiskTier(tmp_path, capacity_blocks=8, block=BLOCK)
    for index in range(3):
        loaded = again.load(key(index))
        assert loaded is not None and torch.equal(loaded, rows(float(index)))
    assert again.load(key(9)) is None
    again.close()


def test_disk_tier_drops_torn_foreign_and_temporary_files_at_start(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, capacity_blocks=8, block=BLOCK)
    tier.store(key(0), rows(0.0))
    tier.store(key(1), rows(1.0))
    written(tier, 2)
    torn = tmp_path / (key(0).hex() + ".kvb")
    torn.write_bytes(torn.read_bytes()[:-7])  # a crash mid-write of a file renamed too early
    renamed = tmp_path / (key(5).hex() + ".kvb")  # a header naming another block
    renamed.write_bytes((tmp_path / (key(1).hex() + ".kvb")).read_bytes())
    (tmp_path / "half.tmp").write_bytes(b"partial")
    again = DiskTier(tmp_path, capacity_blocks=8, block=BLOCK)
    assert again.stats.dropped_bad == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == [key(1).hex() + ".kvb"]
    assert again.load(key(0)) is None and again.load(key(5)) is None
    again.close()


def test_disk_tier_never_serves_a_block_whose_bytes_changed(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, capacity_blocks=8, block=BLOCK)
    tier.store(key(0), rows(3.0))
    written(tier, 1)
    path = tmp_path / (key(0).hex() + ".kvb")
    data = bytearray(path.read_bytes())
    data[HEADER.size + 5] ^= 0xFF  # same size, header intact: only the digest can tell
    path.write_bytes(bytes(data))
    again = DiskTier(tmp_path, capacity_blocks=8, block=BLOCK)
    assert key(0) in again  # the header checks out at start ...
    assert again.load(key(0)) is None  # ... the payload does not: dropped, not served
    assert not path.exists() and again.stats.dropped_bad == 1
    again.close()


def test_disk_tier_holds_at_most_its_capacity_least_recently_used_out(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, capacity_blocks=2, block=BLOCK)
    for index in range(4):
        tier.store(key(index), rows(float(index)))
    written(tier, 4)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        key(index).hex() + ".kvb" for index in (2, 3)
    )


def test_a_block_waiting_for_the_writer_is_served_from_memory(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, capacity_blocks=4, block=BLOCK)
    tier._lock.acquire()  # the writer cannot take the block yet
    try:
        tier._pending[key(0)] = rows(4.0)
    finally:
        tier._lock.release()
    loaded = tier.load(key(0))
    assert loaded is not None and torch.equal(loaded, rows(4.0))
    tier._pending.clear()
    tier.close()


@pytest.mark.parametrize("tiers", ["host", "disk", "host+disk"])
def test_evicted_prefix_blocks_come_back_from_below_with_their_rows(
    tiers: str, tmp_path: Path
) -> None:
    """A pool of 4 blocks: a 3-block prompt's blocks are evicted by another prompt (its tail
    first) and kept below; the first prompt's next request takes back the leading blocks a tier
    still holds, with the rows they held: all three from disk, the first from a one-slot host."""
    config = EngineConfig(block_size=4, num_kv_blocks=4, num_swap_blocks=0)
    manager = KVCacheManager(config)
    manager.cache_root = b"root"
    pool = KVCache(LAYOUT, 4, "cpu")
    host = HostTier(LAYOUT, 1, pin_memory=False) if "host" in tiers else None
    disk = DiskTier(tmp_path, 8, BLOCK) if "disk" in tiers else None
    offload = KVOffload(pool, host, disk)
    manager.attach_offload(offload)

    first = fresh_request("a", [1] * 13)  # three full blocks, one more token
    assert manager.take_cached_prefix(first) == 0
    assert manager.grow(first, 13, [])
    for slot, block_id in enumerate(first.block_ids):
        pool.tensor[:, :, block_id] = float(slot + 1)
    first.num_computed_tokens = 13
    manager.cache_filled(first, 0)
    manager.free(first)
    other = fresh_request("b", [2] * 16)
    assert manager.grow(other, 16, [])  # all four blocks: the three cached ones are evicted
    assert offload.stats.demoted_blocks == 3
    manager.free(other)

    again = fresh_request("c", [1] * 13)
    expected_blocks = 1 if tiers == "host" else 3
    assert manager.take_cached_prefix(again) == 4 * expected_blocks
    for slot, block_id in enumerate(again.block_ids):
        assert torch.equal(pool.tensor[:, :, block_id], torch.full(BLOCK.shape, float(slot + 1)))
    promoted = offload.stats.promoted_blocks
    assert sum(promoted.values()) == expected_blocks
    assert promoted[OffloadTier.HOST] == (1 if host is not None else 0)
    manager.free(again)
    assert manager.block_pool.num_free == 4
    offload.close()


def fresh_request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, SamplingParams(max_tokens=4), 0, 0.0)


def test_the_launcher_gives_each_worker_a_disk_folder_of_its_own() -> None:
    """`pdserve up` passes the engine flags to every worker: the disk tier's folder becomes a
    subfolder named after each worker (both flag spellings), other flags unchanged."""
    args = ("--kv-offload-disk-path", "/kv", "--kv-offload-host-gb", "1")
    assert worker_folders(args, "decode-1") == [
        "--kv-offload-disk-path",
        "/kv/decode-1",
        "--kv-offload-host-gb",
        "1",
    ]
    assert worker_folders(("--kv-offload-disk-path=/kv",), "prefill-0") == [
        "--kv-offload-disk-path=/kv/prefill-0"
    ]
