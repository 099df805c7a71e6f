"""Gauges of the KV-cache manager, the same on both tiers (names in docs/contract.md): the prefix
cache's, the blocks a sliding window gave back, and the KV offload tiers below the pool."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Gauge

from pdserve.core.engine import LLMEngine
from pdserve.core.kv.disk_tier import DiskTier
from pdserve.core.kv.offload import KVOffload, OffloadStats, OffloadTier


def register_prefix_cache_gauges(tier: str, engine: LLMEngine) -> None:
    """Gauges read at scrape time: plain int reads of the KV-cache manager."""
    kv_manager = engine.scheduler.kv_manager
    prefix = f"pdserve_{tier}_prefix_cache"
    Gauge(f"{prefix}_hit_rate", "Share of admitted tokens found cached (0..1)").set_function(
        lambda: kv_manager.num_prefix_hit_tokens / max(kv_manager.num_prefix_query_tokens, 1)
    )
    Gauge(f"{prefix}_hit_tokens", "Admitted tokens whose KV was cached").set_function(
        lambda: kv_manager.num_prefix_hit_tokens
    )
    Gauge(f"{prefix}_query_tokens", "Admitted tokens looked up in the cache").set_function(
        lambda: kv_manager.num_prefix_query_tokens
    )
    Gauge(f"{prefix}_blocks", "Blocks holding a reusable prefix").set_function(
        lambda: kv_manager.usage().num_cached_blocks
    )
    Gauge(f"{prefix}_evictions", "Cached blocks reused for other KV").set_function(
        lambda: kv_manager.usage().num_evictions
    )
    Gauge(
        f"pdserve_{tier}_sliding_window_freed_blocks",
        "Blocks given back once out of every future query's sliding window",
    ).set_function(lambda: kv_manager.num_window_freed_blocks)
    if engine.offload is not None:
        register_offload_gauges(tier, engine.offload)


def register_offload_gauges(tier: str, offload: KVOffload) -> None:
    """The KV offload tiers' counters (docs/kv_offload.md), read at scrape time."""
    prefix = f"pdserve_{tier}_kv_offload"
    stats, nbytes = offload.stats, offload.block_nbytes
    held = Gauge(f"{prefix}_blocks", "Blocks a tier below the pool holds", ["level"])
    promoted = Gauge(
        f"{prefix}_promoted_blocks", "Prefix blocks copied back into the pool, by tier", ["level"]
    )
    for level in OffloadTier:
        promoted.labels(level.value).set_function(_promoted_from(stats, level))
    if offload.host is not None:
        host = offload.host
        held.labels(OffloadTier.HOST.value).set_function(lambda: host.num_used)
    if offload.disk is not None:
        register_disk_gauges(prefix, offload.disk)
        disk = offload.disk
        held.labels(OffloadTier.DISK.value).set_function(lambda: disk.num_used)
    Gauge(f"{prefix}_promoted_bytes", "Bytes copied back into the pool").set_function(
        lambda: sum(stats.promoted_blocks.values()) * nbytes
    )
    Gauge(f"{prefix}_promote_seconds", "Engine-thread time promoting blocks").set_function(
        lambda: stats.promote_seconds
    )
    Gauge(f"{prefix}_demoted_blocks", "Evicted prefix blocks kept below the pool").set_function(
        lambda: stats.demoted_blocks
    )
    Gauge(f"{prefix}_demoted_bytes", "Bytes of evicted blocks kept below").set_function(
        lambda: stats.demoted_blocks * nbytes
    )
    Gauge(f"{prefix}_demote_seconds", "Engine-thread time copying evicted blocks").set_function(
        lambda: stats.demote_seconds
    )


def _promoted_from(stats: OffloadStats, level: OffloadTier) -> Callable[[], float]:
    return lambda: stats.promoted_blocks[level]


def register_disk_gauges(prefix: str, disk: DiskTier) -> None:
    stats = disk.stats
    Gauge(f"{prefix}_disk_written_blocks", "Blocks the disk tier wrote").set_function(
        lambda: stats.written_blocks
    )
    Gauge(f"{prefix}_disk_write_seconds", "Writer-thread time writing blocks").set_function(
        lambda: stats.write_seconds
    )
    Gauge(f"{prefix}_disk_read_seconds", "Engine-thread time reading blocks").set_function(
        lambda: stats.read_seconds
    )
    dropped = Gauge(
        f"{prefix}_disk_dropped_blocks",
        "Blocks dropped: files failing a check (bad), demotions past the writer's backlog",
        ["reason"],
    )
    dropped.labels("bad").set_function(lambda: stats.dropped_bad)
    dropped.labels("backlog").set_function(lambda: stats.dropped_backlog)
