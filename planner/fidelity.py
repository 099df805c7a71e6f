"""The same figures from a real run and from a simulation of it: per-request latencies, their
percentiles, and SLO attainment.

Percentiles use the load runner's rule (ghz's rank rule, loadtest/stats.py) on both sides. ITL is
every gap between token-carrying chunks (the simulator streams one token per step, as a worker
does). A request meets the SLOs when its TTFT is within `ttft_s` and its TPOT (mean time per
output token after the first) within `tpot_s`; attainment is the share that does.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.core.config import EngineConfig
from pdserve.costmodel.profile import Profile
from pdserve.loadtest.stats import percentile
from pdserve.planner.real_runs import Seen
from pdserve.planner.sim_cluster import ClusterSim, Deployment
from pdserve.planner.workload import TraceRequest
from pdserve.router.placement.prefill_place import PlacementConfig

LATENCY_METRICS = ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90")
METRICS = (*LATENCY_METRICS, "attainment")


@dataclass(frozen=True)
class RequestSlo:
    ttft_s: float
    tpot_s: float

    def met_by(self, seen: Seen) -> bool:
        tpot = seen.tpot_s
        return (
            seen.ok
            and seen.ttft_s is not None
            and seen.ttft_s <= self.ttft_s
            and (tpot is None or tpot <= self.tpot_s)
        )


def figures(seen: Sequence[Seen], slo: RequestSlo) -> dict[str, float]:
    """TTFT and ITL p50 / p90 (seconds) and attainment (0..1) of one run."""
    ttfts = sorted(s.ttft_s for s in seen if s.ttft_s is not None)
    gaps = sorted(gap for s in seen for gap in s.gaps_s)
    result = {
        "ttft_p50": _percentile(ttfts, 50),
        "ttft_p90": _percentile(ttfts, 90),
        "itl_p50": _percentile(gaps, 50),
        "itl_p90": _percentile(gaps, 90),
    }
    result["attainment"] = sum(slo.met_by(s) for s in seen) / len(seen) if seen else 0.0
    return result


def _percentile(sorted_values: Sequence[float], percentage: int) -> float:
    return percentile(sorted_values, percentage) if sorted_values else float("nan")


def simulate_seen(
    deployment: Deployment, profile: Profile, trace: Sequence[TraceRequest]
) -> list[Seen]:
    """What each request of the trace would see, by the simulator, in trace order."""
    result = ClusterSim(deployment, profile).run(list(trace))
    journeys = sorted(result.journeys, key=lambda journey: journey.index)
    seen = []
    for journey in journeys:
        times = journey.token_times
        done = len(times) == journey.output_tokens
        ttft = times[0] - journey.arrival_s if times else None
        gaps = tuple(b - a for a, b in itertools.pairwise(times))
        seen.append(Seen(ttft, gaps, len(times), done))
    return seen


def a_priori_deployment(
    num_prefill: int, num_decode: int, engine: EngineConfig, placement: PlacementConfig
) -> Deployment:
    """The deployment as `real_runs` pins it, known before any run: prefill workers share core 0,
    decode workers core 1, each core shared among the workers stepping on it."""
    return Deployment(num_prefill, num_decode, engine, engine, placement, one_core_per_tier=True)
