"""Prometheus metrics of the decode tier (names are in docs/contract.md and the Helm chart); the
streams' own (TTFT, ITL, tokens) are core/serving/stream_metrics.py's, shared with lent prefill
workers."""

from __future__ import annotations

from prometheus_client import Gauge, Histogram

from pdserve.core.serving.cache_metrics import register_prefix_cache_gauges
from pdserve.core.serving.stream_metrics import LATENCY_BUCKETS
from pdserve.decode_service.engine import DecodeEngine

QUEUE_TIME = Histogram(
    "pdserve_decode_queue_seconds",
    "Decode.Reserve called -> blocks reserved",
    buckets=LATENCY_BUCKETS,
)
LIVE_MIGRATION_SECONDS = Histogram(
    "pdserve_decode_live_migration_seconds",
    "Decode.Migrate: a suspended request's KV pushed until the other worker took it all",
    buckets=LATENCY_BUCKETS,
)


def register_engine_gauges(engine: DecodeEngine) -> None:
    """Gauges read at scrape time (plain int reads of engine state; a scrape never blocks it)."""
    register_prefix_cache_gauges("decode", engine)
    kv_manager = engine.scheduler.kv_manager
    receiver = engine.receiver
    speculator = engine.speculator
    Gauge("pdserve_decode_waiting_requests", "Reserved or queued, not yet decoding").set_function(
        lambda: engine.load().num_waiting
    )
    Gauge("pdserve_decode_running_requests", "Decoding (running or swapped)").set_function(
        lambda: engine.load().num_running
    )
    Gauge("pdserve_decode_swapped_requests", "Swapped out to the CPU pool").set_function(
        lambda: len(engine.scheduler.swapped)
    )
    Gauge("pdserve_decode_kv_usage", "Share of KV blocks in use (0..1)").set_function(
        lambda: kv_manager.usage().fraction_used
    )
    Gauge("pdserve_decode_kv_free_blocks", "Free KV blocks").set_function(
        lambda: kv_manager.usage().num_free_blocks
    )
    Gauge("pdserve_decode_swap_used_blocks", "CPU swap blocks in use").set_function(
        lambda: kv_manager.usage().num_used_swap_blocks
    )
    Gauge("pdserve_decode_preemptions", "Preemptions since start").set_function(
        lambda: engine.scheduler.num_preemptions
    )
    Gauge("pdserve_decode_swaps_out", "Swap-outs to the CPU pool since start").set_function(
        lambda: engine.scheduler.num_swaps_out
    )
    Gauge(
        "pdserve_decode_live_migrations_out", "Streams whose KV moved live to another worker"
    ).set_function(lambda: engine.outgoing.num_migrated)
    Gauge(
        "pdserve_decode_live_migration_kv_bytes", "KV bytes sent by live migrations out"
    ).set_function(lambda: engine.outgoing.migrated_kv_bytes)
    Gauge("pdserve_decode_kv_received_bytes", "KV bytes received over UCX").set_function(
        lambda: getattr(receiver, "bytes_received", 0)
    )
    Gauge(
        "pdserve_decode_kv_reused_blocks",
        "Prompt blocks reservations found in this worker's prefix cache (not transferred)",
    ).set_function(lambda: kv_manager.num_reused_blocks)
    Gauge(
        "pdserve_decode_kv_saved_bytes",
        "KV bytes not transferred because this worker held the prompt's leading blocks",
    ).set_function(lambda: engine.saved_kv_bytes)
    Gauge("pdserve_decode_kv_transfer_seconds", "Summed KV transfer time").set_function(
        lambda: getattr(receiver, "seconds", 0.0)
    )
    Gauge(
        "pdserve_decode_spec_drafted_tokens",
        "Speculative draft tokens verified since start (0 with --speculative off)",
    ).set_function(lambda: speculator.num_drafted_tokens if speculator else 0)
    Gauge(
        "pdserve_decode_spec_accepted_tokens",
        "Speculative draft tokens the target model agreed with, since start",
    ).set_function(lambda: speculator.num_accepted_tokens if speculator else 0)
    Gauge(
        "pdserve_decode_spec_acceptance_rate",
        "Accepted over drafted speculative tokens since start (0..1)",
    ).set_function(lambda: speculator.acceptance_rate if speculator else 0.0)
    Gauge(
        "pdserve_decode_kv_rejected_messages",
        "KV messages refused since start for a missing or wrong transfer token",
    ).set_function(lambda: getattr(receiver, "rejected_messages", 0))
    Gauge(
        "pdserve_decode_kv_waiting_for_staging",
        "Expected KV transfers whose receives wait for staging under --kv-staging-limit-mb",
    ).set_function(lambda: getattr(receiver, "num_waiting_for_staging", 0))
