"""Prometheus metrics of the streams a worker generates itself, whichever tier it is in: a decode
worker's, and a prefill worker's when the router lends it streams (names are in docs/contract.md
and the Helm chart; they keep the `pdserve_decode_` prefix because these are Decode calls)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

TIME_TO_FIRST_TOKEN = Histogram(
    "pdserve_decode_time_to_first_token_seconds",
    "Decode.Generate called -> first token sent (mostly waiting for the KV)",
    buckets=LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "pdserve_decode_inter_token_latency_seconds",
    "Time between consecutive tokens of one request",
    buckets=LATENCY_BUCKETS,
)
TOKENS = Counter("pdserve_decode_generated_tokens_total", "Tokens streamed by this worker")
LOCAL_PREFILLS = Counter(
    "pdserve_decode_local_prefills",
    "Requests whose prompt this decode worker prefilled itself (GenerateLocal: colocated path)",
)
