"""Gauges of the KV-cache manager, the same on both tiers (names in docs/contract.md): the prefix
cache's, and the blocks a sliding window gave back."""

from __future__ import annotations

from prometheus_client import Gauge

from pdserve.core.engine import LLMEngine


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
