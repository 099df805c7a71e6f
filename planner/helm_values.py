"""The plan as values for helm/pdserve: replicas per tier, engine settings, and HPAs on the metrics
the chart's HPAs use (prefill: `pdserve_prefill_queue_depth`, decode:
`pdserve_decode_running_requests`).

minReplicas is the plan at the target rate; maxReplicas scales it by peak / target rate (worker
counts grow about linearly with rate once a tier is busy). Each HPA's target is the per-pod
average the simulation saw at the target rate, rounded up: above it, the tier has more load than
the plan was sized for. With no prefill workers (colocated) the prefill tier is off (0 replicas,
no HPA: an HPA cannot hold a Deployment at zero). The router gets the placement the plan simulated
(`router.placement`, `router.disaggThreshold`, `router.maxPrefillQueue`: its `--placement`,
`--disagg-threshold` and `--max-prefill-queue`). An adaptive plan also gives the router the
workers' token budget a step (`router.maxNumBatchedTokens`); its cost model comes from
`router.profile`: a path in the router's pod to the profile the plan was made with, which the
operator provides (the chart does not mount one). A plan made with admission on gives the router
its SLOs (`router.sloTtftSeconds`, `router.sloTpotSeconds`), which need that profile too.
"""

from __future__ import annotations

import math
from typing import Any

from pdserve.planner.plan import Candidate

PREFILL_METRIC = "pdserve_prefill_queue_depth"
DECODE_METRIC = "pdserve_decode_running_requests"


def helm_values(plan: Candidate, rate: float, peak_rate: float) -> dict[str, Any]:
    deployment = plan.deployment
    scale = max(peak_rate / rate, 1.0)
    prefill_engine, decode_engine = _engine(plan, "prefill"), _engine(plan, "decode")
    return {
        "router": {
            "disaggThreshold": deployment.placement.disagg_threshold,
            "maxPrefillQueue": deployment.placement.max_prefill_queue,
            "placement": deployment.placement.mode.value,
        }
        | _cost_model(plan)
        | _admission(plan),
        "prefill": _tier(
            deployment.num_prefill, scale, PREFILL_METRIC, plan.prefill_load, prefill_engine
        ),
        "decode": _tier(
            deployment.num_decode, scale, DECODE_METRIC, plan.decode_running, decode_engine
        ),
    }


def _cost_model(plan: Candidate) -> dict[str, int]:
    """Adaptive placement predicts the workers' prompt chunks from their token budget."""
    if not plan.deployment.adaptive:
        return {}
    return {"maxNumBatchedTokens": plan.deployment.decode_config.max_num_batched_tokens}


def _admission(plan: Candidate) -> dict[str, float]:
    """The SLOs the plan's router refused predicted misses of (docs/admission.md)."""
    slo = plan.deployment.admission
    if slo is None:
        return {}
    values = {"sloTtftSeconds": slo.ttft_s, "sloTpotSeconds": slo.tpot_s}
    return {key: value for key, value in values.items() if value is not None}


def _engine(plan: Candidate, tier: str) -> dict[str, int]:
    config = getattr(plan.deployment, f"{tier}_config")
    return {
        "maxNumSeqs": config.max_num_seqs,
        "maxNumBatchedTokens": config.max_num_batched_tokens,
        "numKvBlocks": config.num_kv_blocks,
        "numSwapBlocks": config.num_swap_blocks,
    }


def _tier(
    replicas: int, scale: float, metric: str, per_pod: float, engine: dict[str, int]
) -> dict[str, Any]:
    if replicas == 0:
        return {"replicas": 0, "autoscaling": {"enabled": False}, "engine": engine}
    return {
        "replicas": replicas,
        "engine": engine,
        "autoscaling": {
            "enabled": True,
            "minReplicas": replicas,
            "maxReplicas": max(math.ceil(replicas * scale), replicas),
            "cpu": {"enabled": False},
            "podsMetric": {
                "enabled": True,
                "name": metric,
                "targetAverageValue": str(max(math.ceil(per_pod), 1)),
            },
        },
    }
