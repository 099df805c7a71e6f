"""KV offload: the tiers below the pool that keep evicted prefix blocks for reuse (host memory,
then disk), on prefill and decode workers alike.

The pool's prefix cache keeps a freed block until its slot is needed for other KV; without
offload its content is lost there. With it, the pool calls `demote` as it evicts a cached block,
before the slot is handed out (so before anything can write over it): the block's rows are
copied into the host tier, whose least recently used block goes on to the disk tier, written by
the disk tier's own thread. With no host tier, the copy goes straight to the disk writer.

A request that finds its prefix missing from the pool looks further down (`KVCacheManager.
take_cached_prefix`): the leading blocks a tier holds are copied into fresh pool blocks
(`promote`) and registered there, and the request computes only what no tier had. A decode worker
does the same when it reserves a prompt's blocks, so only blocks that no tier of its own holds
travel from prefill.

What moves is only ever a registered block: full, and computed from verified tokens (the pool
registers nothing else), so a speculative rollback or a copy-on-write never writes a partial
block down; and a block's key is its chained hash under the pool's root, which names the model
and the KV layout (int8 or not, the sliding window's model), so a block is promoted only for the
same tokens after the same prefix on the same layout.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import BlockHash
from pdserve.core.kv.cache import KVCache
from pdserve.core.kv.disk_tier import BlockShape, DiskTier
from pdserve.core.kv.host_tier import HostTier


class OffloadTier(enum.Enum):
    HOST = "host"
    DISK = "disk"


@dataclass
class OffloadStats:
    """Counters since start, read by the metrics and the offload bench."""

    demoted_blocks: int = 0  # evicted from the pool and kept below it
    demote_seconds: float = 0.0  # the engine thread's time copying them out
    promoted_blocks: dict[OffloadTier, int] = field(
        default_factory=lambda: dict.fromkeys(OffloadTier, 0)
    )
    promote_seconds: float = 0.0  # the engine thread's time copying blocks back into the pool


class KVOffload:
    def __init__(self, pool: KVCache, host: HostTier | None, disk: DiskTier | None) -> None:
        if host is None and disk is None:
            raise ValueError("KV offload needs a host tier, a disk tier or both")
        self.pool = pool
        self.host = host
        self.disk = disk
        self.stats = OffloadStats()

    @property
    def capacity_blocks(self) -> int:
        """Blocks the tiers can hold, all together."""
        host = 0 if self.host is None else self.host.num_blocks
        return host + (0 if self.disk is None else self.disk.capacity_blocks)

    @property
    def block_nbytes(self) -> int:
        return self.pool.layout.block_nbytes

    def demote(self, block_id: int, block_hash: BlockHash) -> None:
        """The pool evicts `block_id`, which holds `block_hash`: keep its rows below."""
        start = time.perf_counter()
        rows = self.pool.tensor[:, :, block_id]
        if self.host is not None:
            if block_hash in self.host:
                self.host.touch(block_hash)
            else:
                displaced = self.host.store(block_hash, rows)
                if displaced is not None and self.disk is not None:
                    self.disk.store(*displaced)
        elif self.disk is not None:
            self.disk.store(block_hash, rows.to("cpu", copy=True))
        self.stats.demoted_blocks += 1
        self.stats.demote_seconds += time.perf_counter() - start

    def holds(self, block_hash: BlockHash) -> bool:
        """Whether a tier below the pool holds the block (it may still fail its checks)."""
        in_host = self.host is not None and block_hash in self.host
        return in_host or (self.disk is not None and block_hash in self.disk)

    def promote(self, block_hash: BlockHash, block_id: int) -> OffloadTier | None:
        """Copies the block's rows into pool block `block_id`; the tier they came from, or None
        (nothing written) when no tier has them (any more)."""
        start = time.perf_counter()
        tier, rows = self._find(block_hash)
        if tier is None or rows is None:
            return None
        self.pool.tensor[:, :, block_id].copy_(rows)
        self.stats.promoted_blocks[tier] += 1
        self.stats.promote_seconds += time.perf_counter() - start
        return tier

    def _find(self, block_hash: BlockHash) -> tuple[OffloadTier | None, torch.Tensor | None]:
        if self.host is not None:
            rows = self.host.load(block_hash)
            if rows is not None:
                return OffloadTier.HOST, rows
        if self.disk is not None:
            rows = self.disk.load(block_hash)
            if rows is not None:
                return OffloadTier.DISK, rows
        return None, None

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()


def build_offload(config: EngineConfig, pool: KVCache) -> KVOffload | None:
    """The tiers `config` asks for below `pool` (None: no offload). The disk tier's folder,
    `kv_offload_disk_path`, is this worker's own (`pdserve up` gives each worker a subfolder
    named after it, the chart each pod a volume): a worker restarted on it reuses its blocks."""
    block_nbytes = pool.layout.block_nbytes
    host_blocks = int(config.kv_offload_host_gb * 1e9) // block_nbytes
    disk_blocks = int(config.kv_offload_disk_gb * 1e9) // block_nbytes
    host = (
        HostTier(pool.layout, host_blocks, pin_memory=pool.tensor.device.type == "cuda")
        if host_blocks
        else None
    )
    disk = None
    if config.kv_offload_disk_path and disk_blocks:
        shape = BlockShape(tuple(pool.tensor[:, :, 0].shape), pool.tensor.dtype)
        disk = DiskTier(Path(config.kv_offload_disk_path), disk_blocks, shape)
    if host is None and disk is None:
        return None
    return KVOffload(pool, host, disk)
