"""`pdserve plan --verify`: run the plan's deployment here and check what it predicted.

The chosen deployment starts with one core per worker (the cost the plan counted; so its
workers must fit this machine's cores), its router placing prompts as the plan's deployment says.
The workload's lengths at the planned rate are streamed through it at Poisson arrivals from the
load runner's schedule, and the simulator is handed those very arrivals. Both sides are judged by
the plan's SLOs: `meets_slo` is the plan's own rule (TTFT p90 and ITL p99 within their SLOs);
attainment is the share of requests with TTFT within the TTFT SLO and TPOT within the ITL SLO.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pdserve.costmodel.profile import Profile
from pdserve.loadtest.schedule import LoadSchedule
from pdserve.loadtest.stats import percentile
from pdserve.planner.fidelity import RequestSlo, figures, simulate_seen
from pdserve.planner.plan import Candidate, Slo
from pdserve.planner.real_runs import (
    Arrivals,
    Seen,
    own_cores,
    run_trace,
    running_cluster,
    warm_up,
)
from pdserve.planner.workload import TraceRequest

VERIFY_SEED = 20261201  # the arrivals of the verification run (any fixed number would do)


def verify(
    plan: Candidate,
    profile: Profile,
    lengths: Sequence[TraceRequest],
    rate: float,
    slo: Slo,
    model_dir: Path,
    log_dir: Path,
) -> dict[str, Any]:
    deployment = plan.deployment
    arrivals = Arrivals(rate, LoadSchedule.POISSON, VERIFY_SEED)
    trace = arrivals.apply(lengths)
    router_args = deployment.placement.router_flags()
    if deployment.adaptive:  # the router predicts with the profile the plan was made with
        profile.save(log_dir / "profile.json")
        router_args += ("--profile", str(log_dir / "profile.json"))
        budget = str(deployment.decode_config.max_num_batched_tokens)
        router_args += ("--max-num-batched-tokens", budget)
    pins = own_cores(deployment.num_prefill, deployment.num_decode)
    engine = deployment.decode_config
    with running_cluster(
        deployment.num_prefill, deployment.num_decode, model_dir, engine, router_args, log_dir, pins
    ) as cluster:
        warm_up(cluster)
        real = run_trace(cluster, trace, arrivals, seed="plan-verify")
    one_core_each = dataclasses.replace(deployment, prefill_share=1.0, decode_share=1.0)
    predicted = simulate_seen(one_core_each, profile, trace)
    return report(deployment.name, rate, slo, predicted, real)


def report(
    name: str, rate: float, slo: Slo, predicted: Sequence[Seen], real: Sequence[Seen]
) -> dict[str, Any]:
    per_request = RequestSlo(ttft_s=slo.ttft_p90_s, tpot_s=slo.itl_p99_s)
    sides = {"predicted": predicted, "real": real}
    result: dict[str, Any] = {"plan": name, "rate": rate}
    for side, seen in sides.items():
        result[f"{side}_attainment"] = figures(seen, per_request)["attainment"]
    for side, seen in sides.items():
        ttft_p90, itl_p99 = _plan_figures(seen)
        result[f"meets_slo_{side}"] = ttft_p90 <= slo.ttft_p90_s and itl_p99 <= slo.itl_p99_s
        result[f"{side}_ttft_p90"], result[f"{side}_itl_p99"] = ttft_p90, itl_p99
    result["requests"] = len(real)
    result["completed"] = sum(s.ok for s in real)
    return result


def _plan_figures(seen: Sequence[Seen]) -> tuple[float, float]:
    """TTFT p90 and ITL p99 as the plan computes them (every request must complete)."""
    if not all(s.ok for s in seen):
        return float("inf"), float("inf")
    ttfts = sorted(s.ttft_s for s in seen if s.ttft_s is not None)
    gaps = sorted(gap for s in seen for gap in s.gaps_s)
    return percentile(ttfts, 90), percentile(gaps, 99) if gaps else 0.0
