"""The router's Prometheus metrics (served by ServiceHost on --metrics-port), in seconds."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Latency buckets from sub-millisecond (router overhead, fake tiers) to minutes (long outputs).
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)

REQUESTS = Counter(
    "pdserve_router_requests",
    "Finished public API calls, by method and gRPC status code",
    ["method", "code"],
)
TIME_TO_FIRST_TOKEN = Histogram(
    "pdserve_router_time_to_first_token_seconds",
    "From arrival at the router to the first output token",
    buckets=_LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "pdserve_router_inter_token_latency_seconds",
    "Gap between consecutive token deltas of one request, per token",
    buckets=_LATENCY_BUCKETS,
)
END_TO_END_LATENCY = Histogram(
    "pdserve_router_e2e_latency_seconds",
    "From arrival at the router to the last output token (successful requests)",
    buckets=_LATENCY_BUCKETS,
)
# Token counts from one token to the longest contexts (powers of two).
_LENGTH_BUCKETS = tuple(float(2**i) for i in range(17))
PROMPT_TOKENS = Histogram(
    "pdserve_router_prompt_tokens",
    "Prompt tokens of each finished request: with output_tokens, the mix an autoscaler sizes for",
    buckets=_LENGTH_BUCKETS,
)
ADMITTED_PROMPT_TOKENS = Histogram(
    "pdserve_router_admitted_prompt_tokens",
    "Prompt tokens of each stream as the router admits it (a sample of n counts n): its count "
    "over an interval is the arrival rate pdserve autoscale sizes for (finished requests lag "
    "arrivals exactly when the deployment is short)",
    buckets=_LENGTH_BUCKETS,
)
OUTPUT_TOKENS = Histogram(
    "pdserve_router_output_tokens",
    "Output tokens of each finished request (a sample of n counts apart)",
    buckets=_LENGTH_BUCKETS,
)
IN_FLIGHT = Gauge(
    "pdserve_router_requests_in_flight",
    "Streams in flight in the router (a call of n samples counts n), against --max-queue",
)
REDIRECTS = Counter(
    "pdserve_router_redirects",
    "Prompts still queued for prefill whose decode worker left (drained): redirected to another "
    "decode worker's reservation; too_late (their KV had begun to leave, or the new Reserve or the "
    "Redirect failed: the leaving worker takes it); no_other_worker",
    ["outcome"],
)
RETRIES = Counter(
    "pdserve_router_retries",
    "Reserve + Prefill attempts retried after a worker failure, by the tier that failed",
    ["tier"],
)
WORKERS = Gauge(
    "pdserve_router_workers",
    "Workers per tier: known (from flags or DNS) and healthy (answered the last Load poll)",
    ["tier", "state"],
)
PREFILL_PLACEMENTS = Counter(
    "pdserve_router_prefill_placements",
    "Where prompts were prefilled (local: on their decode worker; remote: on the prefill tier), "
    "and why (router/placement/prefill_place.py)",
    ["place", "reason"],
)
MIGRATIONS = Counter(
    "pdserve_router_migrations",
    "Requests moved off a decode worker mid-request: with their KV, off a draining worker "
    "(live); re-prefilled on another, off a lost worker or when a live move failed (migrated); "
    "or ended UNAVAILABLE because none could take them (failed)",
    ["outcome"],
)
ROLE_CHANGES = Counter(
    "pdserve_router_role_changes",
    "Prefill workers lent streams by adaptive placement (role decode) and taken back once their "
    "streams were done (role prefill) (router/placement/roles.py)",
    ["role"],
)
STEP_CORRECTION = Gauge(
    "pdserve_router_step_correction",
    "Measured / predicted step time of each worker by step phase, from its Load reports: the "
    "factor adaptive placement scales --profile by for that worker (costmodel/correction.py; "
    "1: too few steps yet). Only with --profile",
    ["phase", "tier", "worker"],
)
PENDING_PROMPT_TOKENS = Gauge(
    "pdserve_router_worker_pending_prompt_tokens",
    "Each worker's prompt tokens accepted and not yet computed, from its last Load report: the "
    "prefill backlog pdserve autoscale adds to the load it sizes for",
    ["tier", "worker"],
)
STEP_WINDOW = Gauge(
    "pdserve_router_step_window",
    "Each worker's recent steps of a phase, summed, from its Load reports (quantity: steps, "
    "seconds, prefill_tokens, prefill_pairs, decode_seqs, decode_context; costmodel/"
    "correction.py). pdserve autoscale corrects its profile per tier by them",
    ["tier", "worker", "phase", "quantity"],
)
TENANT_REQUESTS = Counter(
    "pdserve_router_tenant_requests",
    "Requests by tenant (as --tenants lists it; others: unlisted) and outcome: admitted, or "
    "refused for queue_full, fair_share, displaced, tenant_rate (router/places.py, tenants.py)",
    ["tenant", "outcome"],
)
ADMISSION_REFUSALS = Counter(
    "pdserve_router_admission_refusals",
    "Requests refused at once because their predicted TTFT or TPOT missed their SLO "
    "(router/slo_admission.py), by which (reason)",
    ["reason"],
)
# Exported at 0 from the start, for dashboards and alerts (slo_admission.Miss's values).
for _reason in ("ttft", "tpot", "running_tpot"):
    ADMISSION_REFUSALS.labels(_reason)
TTFT_PREDICTION_RATIO = Histogram(
    "pdserve_router_ttft_prediction_ratio",
    "Measured / predicted time to first token of every request adaptive placement placed, and "
    "of those admitted under an SLO (router/slo_admission.py) by any placement, by where the "
    "prompt was prefilled (place: local, remote): the cost model's error as production sees it",
    ["place"],
    buckets=(0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0),
)
for _place in ("local", "remote"):
    TTFT_PREDICTION_RATIO.labels(_place)
