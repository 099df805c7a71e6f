"""`pdserve profile --serving`: what a serving worker pays beyond the offline `engine.step()`,
measured through real processes in a run of its own (never the run a prediction is checked on).

A 1P1D cluster (pinned as real_runs.py says) serves bursts of B identical requests (B = 1, 2, 4,
8, 16 unless `--bursts` says otherwise; 32-token prompts, 48 output tokens, fresh prompts each
burst). The simulator, given the offline profile alone, predicts the same bursts. Two residuals
are fitted:

- ITL: the real median gap minus the simulated one, per burst, is `per_step_s + per_token_s * B`
  (least squares, both >= 0): the loop turn around each step, and each streamed token's sink,
  gRPC message and router relay, which grow with the batch.
- TTFT: with those costs in, what the one-request burst still lacks is `dispatch_s`: the calls a
  request makes through the router before its prompt is scheduled.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from pdserve.core.config import EngineConfig
from pdserve.costmodel.profile import Profile, ServingCosts
from pdserve.planner.fidelity import a_priori_deployment, simulate_seen
from pdserve.planner.real_runs import Arrivals, Seen, run_trace, running_cluster, warm_up
from pdserve.planner.workload import TraceRequest
from pdserve.router.placement.prefill_place import PlacementConfig

BURSTS = (1, 2, 4, 8, 16)
PROMPT_TOKENS, OUTPUT_TOKENS = 32, 48


def burst(size: int) -> list[TraceRequest]:
    return [TraceRequest(0.0, PROMPT_TOKENS, OUTPUT_TOKENS)] * size


def calibrate(
    model_dir: Path,
    profile: Profile,
    engine: EngineConfig,
    log_dir: Path,
    bursts: Sequence[int] = BURSTS,
) -> ServingCosts:
    real: dict[int, list[Seen]] = {}
    router_flags = PlacementConfig().router_flags()
    with running_cluster(1, 1, model_dir, engine, router_flags, log_dir) as cluster:
        warm_up(cluster)
        for size in sorted(set(bursts)):
            real[size] = run_trace(cluster, burst(size), Arrivals(0.0), seed=f"serving/{size}")
    return fit_serving(profile, engine, real)


def fit_serving(
    profile: Profile, engine: EngineConfig, real: dict[int, list[Seen]]
) -> ServingCosts:
    """The serving costs that close the gap between the offline profile's simulation and `real`
    (seen per burst size)."""
    offline = replace(profile, serving=ServingCosts())
    deployment = a_priori_deployment(1, 1, engine, PlacementConfig())  # 1P1D: all remote
    sizes = sorted(real)
    residuals = [
        _median_gap(real[size]) - _median_gap(simulate_seen(deployment, offline, burst(size)))
        for size in sizes
    ]
    per_step, per_token = _non_negative_line(sizes, residuals)
    stepped = replace(offline, serving=ServingCosts(per_step, per_token))
    simulated_ttft = simulate_seen(deployment, stepped, burst(1))[0].ttft_s or 0.0
    real_ttft = statistics.median(s.ttft_s for s in real[min(sizes)] if s.ttft_s is not None)
    calibration = {
        "bursts": sizes,
        "itl_residual_s": residuals,
        "real_ttft_s": real_ttft,
        "simulated_ttft_s": simulated_ttft,
    }
    return ServingCosts(per_step, per_token, max(real_ttft - simulated_ttft, 0.0), calibration)


def _median_gap(seen: Sequence[Seen]) -> float:
    return statistics.median(gap for s in seen for gap in s.gaps_s)


def _non_negative_line(xs: Sequence[int], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (x, y), each clamped at >= 0 by
    refitting the other alone (more tokens never cost less; a step never costs negative)."""
    x = np.array(xs, dtype=float)
    y = np.array(ys, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    if slope < 0:
        return max(float(y.mean()), 0.0), 0.0
    if intercept < 0:
        return 0.0, max(float((x * y).sum() / (x * x).sum()), 0.0)
    return float(intercept), float(slope)
