"""KV offload's bookkeeping under random traffic: a small pool, a one-or-two-slot host tier and a
small disk tier below it, requests over a tiny vocabulary (so prefixes collide and recur) that
take their cached prefix, compute the rest and leave, in any order.

Every block a request computes is filled with rows that name its chained hash (`rows_for`). The
property: whenever a request takes its cached prefix (from the pool, or promoted from host or
disk), every block of its table holds exactly the rows of its own position's hash, so no block is
ever served unless the whole chain before it is the request's own; the tiers never hold more than
their capacity; and once every request left, the pool has all its blocks back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import BlockHash
from pdserve.core.kv.cache import KVCache, KVLayout
from pdserve.core.kv.disk_tier import BlockShape, DiskTier
from pdserve.core.kv.host_tier import HostTier
from pdserve.core.kv.manager import KVCacheManager
from pdserve.core.kv.offload import KVOffload
from pdserve.core.request import Request
from pdserve.core.sampling_params import SamplingParams

BLOCK_SIZE = 2
LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, block_size=BLOCK_SIZE, dtype="float32")
BLOCK = BlockShape((1, 2, BLOCK_SIZE, 1, 4), torch.float32)
POOL_BLOCKS = 8
DISK_BLOCKS = 6

# A request: its tokens over a 3-token vocabulary (2-9 tokens: up to 4 full blocks), or the
# index of a running request to finish.
TRAFFIC = st.lists(
    st.one_of(
        st.lists(st.integers(0, 2), min_size=2, max_size=9).map(tuple),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=40,
)


def rows_for(block_hash: BlockHash) -> torch.Tensor:
    """Rows that say which chained hash they were computed for."""
    return torch.full(BLOCK.shape, float(int.from_bytes(block_hash[:3], "little")))


@pytest.mark.parametrize("host_slots", [0, 1, 2])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(traffic=TRAFFIC)
def test_promoted_blocks_always_hold_their_own_chain(
    host_slots: int, traffic: list[tuple[int, ...] | int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    manager = KVCacheManager(EngineConfig(block_size=BLOCK_SIZE, num_kv_blocks=POOL_BLOCKS))
    manager.cache_root = b"root"
    pool = KVCache(LAYOUT, POOL_BLOCKS, "cpu")
    host = HostTier(LAYOUT, host_slots, pin_memory=False) if host_slots else None
    disk = DiskTier(Path(tmp_path_factory.mktemp("disk")), DISK_BLOCKS, BLOCK)
    offload = KVOffload(pool, host, disk)
    manager.attach_offload(offload)
    running: list[Request] = []
    try:
        for index, step in enumerate(traffic):
            if isinstance(step, int):
                if running:
                    manager.free(running.pop(step % len(running)))
                continue
            request = Request(str(index), list(step), SamplingParams(max_tokens=1), index, 0.0)
            start(manager, pool, request)
            if request.block_ids:
                running.append(request)
            assert host is None or host.num_used <= host.num_blocks
            assert disk.num_used <= DISK_BLOCKS + 256  # files, plus what waits for the writer
        for request in running:
            manager.free(request)
        assert manager.block_pool.num_free == POOL_BLOCKS
    finally:
        offload.close()
    assert len(list(disk.folder.glob("*.kvb"))) <= DISK_BLOCKS


def start(manager: KVCacheManager, pool: KVCache, request: Request) -> None:
    """Takes the request's cached prefix (checking every block of it), then computes the rest if
    the pool has room (else gives everything back, as the scheduler does)."""
    cached = manager.take_cached_prefix(request)
    hashes = request.block_hashes
    for position, block_id in enumerate(request.block_ids):
        assert torch.equal(pool.tensor[:, :, block_id], rows_for(hashes[position])), (
            f"block {position} of {request.prompt_token_ids} holds another chain's rows"
        )
    new = request.num_tokens - cached
    if not manager.grow(request, new, []):
        manager.free_for_recompute(request)
        return
    for position in range(cached // BLOCK_SIZE, request.num_tokens // BLOCK_SIZE):
        pool.tensor[:, :, request.block_ids[position]] = rows_for(hashes[position])
    request.num_computed_tokens = request.num_tokens
    manager.cache_filled(request, cached)
