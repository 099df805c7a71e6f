"""Prometheus metrics of the prefill tier (names are in docs/contract.md and the Helm chart)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from pdserve.core.serving.cache_metrics import register_prefix_cache_gauges
from pdserve.prefill_service.engine import PrefillEngine

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

QUEUE_TIME = Histogram(
    "pdserve_prefill_queue_seconds", "Prefill called -> first scheduled", buckets=LATENCY_BUCKETS
)
PREFILL_TIME = Histogram(
    "pdserve_prefill_compute_seconds", "First scheduled -> first token", buckets=LATENCY_BUCKETS
)
TRANSFER_TIME = Histogram(
    "pdserve_prefill_kv_transfer_seconds",
    "KV gather + UCX send until decode took the bytes",
    buckets=LATENCY_BUCKETS,
)
PROMPT_TOKENS = Counter("pdserve_prefill_prompt_tokens_total", "Prompt tokens prefilled")
REDIRECTS = Counter(
    "pdserve_prefill_redirects",
    "Prefill.Redirect calls by outcome: redirected (the queued prompt's KV goes to the new "
    "reservation) or too_late (its KV had begun to leave for the first)",
    ["outcome"],
)


def register_engine_gauges(engine: PrefillEngine) -> None:
    """Gauges read at scrape time (plain reads of engine state; a scrape never blocks it)."""
    register_prefix_cache_gauges("prefill", engine)
    kv_manager = engine.scheduler.kv_manager
    Gauge("pdserve_prefill_queue_depth", "Prompts accepted and not yet shipped").set_function(
        engine.queue_depth
    )
    Gauge("pdserve_prefill_kv_usage", "Share of KV blocks in use (0..1)").set_function(
        lambda: kv_manager.usage().fraction_used
    )
    Gauge("pdserve_prefill_kv_sent_bytes", "KV bytes sent over UCX").set_function(
        lambda: getattr(engine.sender, "bytes_sent", 0)
    )
    Gauge(
        "pdserve_prefill_kv_sent_pieces", "KV messages delivered (one per group of layers)"
    ).set_function(lambda: getattr(engine.sender, "pieces_sent", 0))
