"""`pdserve simulate --validate`: the simulator's a-priori predictions against the real cluster.

For each configuration (`1P1D`: prefill pinned to core 0, decode to core 1; `1P2D`: both decode
workers share core 1; `2P1D`: both prefill workers share core 0; planner/real_runs.py) it starts
the real router and workers, warms them up, and at each rate, `--repeats` times, streams a trace
through the router: the workload's lengths (a Poisson SPEC's drawn afresh each repeat), request i
at i / rate, prompts from a seed of that rate and repeat (no prompt replays another's). The same
trace is then simulated.

The simulation knows only what was known before the run: the profile (its offline step model and
the serving costs `pdserve profile --serving` measured in a run of its own) and which workers are
pinned to one core (shared among those stepping: planner/sim_worker.py `SharedCore`). Nothing
measured during the run feeds it.

Per configuration, rate and metric one line: the real and simulated means over the repeats,
error = |sim - real| / real (for `attainment`: |sim - real|, a difference of shares), the 95 % t
interval of the real value, and the real system's own noise: how far each repeat is from the mean
of the others, |others - repeat| / repeat, averaged over the repeats (the error a perfect
simulator of the mean would still show against one run; needs 2 repeats). Then the verdict over
TTFT p50/p90 and ITL p50/p90: median |error| <= 10 % or within the median noise, whichever is
larger, and every |error| <= 25 % (or within the largest noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pdserve.core.config import EngineConfig
from pdserve.core.model.source import resolve_model
from pdserve.costmodel.profile import Profile
from pdserve.loadtest.stats import mean_interval
from pdserve.planner.fidelity import (
    LATENCY_METRICS,
    METRICS,
    RequestSlo,
    a_priori_deployment,
    figures,
    simulate_seen,
)
from pdserve.planner.real_runs import Arrivals, log_folder, run_trace, running_cluster, warm_up
from pdserve.planner.workload import PoissonSpec, TraceRequest, Workload, requests_of
from pdserve.router.placement.prefill_place import PlacementConfig

CONFIGS = {"1P1D": (1, 1), "1P2D": (1, 2), "2P1D": (2, 1)}
TARGET_MEDIAN, TARGET_MAX = 0.10, 0.25


@dataclass(frozen=True)
class Point:
    config: str
    rate: float
    real: tuple[dict[str, float], ...]  # one per repeat
    sim: tuple[dict[str, float], ...]
    loadavg: str


def run_validation(
    args: argparse.Namespace, profile: Profile, workload: Workload, engine: EngineConfig
) -> int:
    rates = [float(part) for part in args.rates.split(",")] if args.rates else [1.0, 2.0, 3.0]
    configs = [name.strip() for name in args.configs.split(",")]
    unknown = [name for name in configs if name not in CONFIGS]
    if unknown or min(rates) <= 0 or args.repeats < 1:
        raise ValueError(
            f"--configs: each of {sorted(CONFIGS)}, --rates > 0, --repeats >= 1 "
            f"(got {args.configs!r}, {args.rates!r}, {args.repeats})"
        )
    slo = RequestSlo(args.slo_ttft, args.slo_tpot)
    lines: list[dict[str, Any]] = []
    with log_folder(args.out_dir, "validate") as out_dir:
        for name in configs:
            points = _validate_config(name, rates, args, profile, workload, engine, slo, out_dir)
            for point in points:
                for line in point_lines(point):
                    print(json.dumps(line) if args.json else _text(line), flush=True)
                    lines.append(line)
    verdict = summary(lines)
    print(json.dumps(verdict) if args.json else _verdict_text(verdict), flush=True)
    if args.plot:
        plot_fidelity(lines, args.plot)
    return 0


def _validate_config(
    name: str,
    rates: list[float],
    args: argparse.Namespace,
    profile: Profile,
    workload: Workload,
    engine: EngineConfig,
    slo: RequestSlo,
    out_dir: Path,
) -> list[Point]:
    num_prefill, num_decode = CONFIGS[name]
    placement = PlacementConfig(args.disagg_threshold, args.max_prefill_queue)
    deployment = a_priori_deployment(num_prefill, num_decode, engine, placement)
    router_args = placement.router_flags()
    model_dir = resolve_model(args.model)
    points = []
    log_dir = out_dir / f"{name}-logs"
    with running_cluster(num_prefill, num_decode, model_dir, engine, router_args, log_dir) as c:
        warm_up(c)
        for rate in rates:
            loadavg = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            real, sim = [], []
            for repeat in range(args.repeats):
                trace = validation_trace(workload, rate, args.traffic_s, repeat)
                seen = run_trace(c, trace, Arrivals(rate), seed=f"validate/{rate}/{repeat}")
                real.append(figures(seen, slo))
                sim.append(figures(simulate_seen(deployment, profile, trace), slo))
            points.append(Point(name, rate, tuple(real), tuple(sim), loadavg))
    return points


def validation_trace(
    workload: Workload, rate: float, traffic_s: float, repeat: int
) -> list[TraceRequest]:
    """`rate x traffic_s` requests at the load runner's constant rate with the workload's lengths
    (a Poisson SPEC's drawn with its seed + repeat, so every repeat has lengths of its own)."""
    if isinstance(workload, PoissonSpec):
        workload = replace(workload, seed=workload.seed + repeat)
    lengths = requests_of(workload)
    count = max(int(rate * traffic_s), 1)
    return Arrivals(rate).apply([lengths[(i + repeat) % len(lengths)] for i in range(count)])


def point_lines(point: Point) -> list[dict[str, Any]]:
    lines = []
    for metric in METRICS:
        real_values = [run[metric] for run in point.real]
        real = mean_interval(real_values)
        sim = statistics.fmean(run[metric] for run in point.sim)
        error = abs(sim - real.mean) if metric == "attainment" else _relative(sim, real.mean)
        noise = repeat_noise(real_values, relative=metric != "attainment")
        lines.append(
            {
                "config": point.config,
                "rate": point.rate,
                "metric": metric,
                "real": real.mean,
                "sim": sim,
                "error": error,
                "noise": noise,
                "real_ci": [real.low, real.high],
                "repeats": len(point.real),
                "loadavg": point.loadavg,
            }
        )
    return lines


def repeat_noise(values: Sequence[float], relative: bool) -> float | None:
    """How far one repeat is from the mean of the others, averaged over the repeats (relative to
    the repeat, or as a difference for shares); None with fewer than two repeats."""
    if len(values) < 2:
        return None
    gaps = []
    for index, value in enumerate(values):
        others = statistics.fmean([*values[:index], *values[index + 1 :]])
        gaps.append(_relative(others, value) if relative else abs(others - value))
    return statistics.fmean(gaps)


def summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    latency = [line for line in lines if line["metric"] in LATENCY_METRICS]
    errors = [line["error"] for line in latency]
    noises = [line["noise"] for line in latency if line["noise"] is not None]
    median = statistics.median(errors) if errors else float("nan")
    worst = max(errors, default=float("nan"))
    noise_median = statistics.median(noises) if noises else 0.0
    noise_max = max(noises, default=0.0)
    return {
        "latency_errors": len(errors),
        "median_error": median,
        "max_error": worst,
        "median_noise": noise_median if noises else None,
        "max_noise": noise_max if noises else None,
        "meets_target": (
            median <= max(TARGET_MEDIAN, noise_median) and worst <= max(TARGET_MAX, noise_max)
        ),
        "within_9_percent": sum(error <= 0.09 for error in errors),
    }


def _relative(sim: float, real: float) -> float:
    return abs(sim - real) / real if real else float("inf")


def _text(line: dict[str, Any]) -> str:
    low, high = line["real_ci"]
    return (
        f"{line['config']:5} rate {line['rate']:g}/s {line['metric']:10} real {line['real']:9.4f} "
        f"[{low:.4f}, {high:.4f}] sim {line['sim']:9.4f} error {line['error']:6.1%} "
        f"noise {_share(line['noise'])} (x{line['repeats']}, load {line['loadavg']})"
    )


def _share(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:6.1%}"


def _verdict_text(verdict: dict[str, Any]) -> str:
    return (
        f"TTFT/ITL p50/p90: median |error| {verdict['median_error']:.1%}, max "
        f"{verdict['max_error']:.1%} over {verdict['latency_errors']} figures "
        f"({verdict['within_9_percent']} within 9 %); the real runs' own noise: median "
        f"{_share(verdict['median_noise']).strip()}, max {_share(verdict['max_noise']).strip()}; "
        "target (median <= 10 % or the median noise, all <= 25 % or the largest noise) "
        f"{'met' if verdict['meets_target'] else 'missed'}"
    )


def plot_fidelity(lines: list[dict[str, Any]], path: Path) -> None:
    """One panel per metric: real (solid, with its interval) and simulated (dashed) per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.5))
    for axis, metric in zip(axes, METRICS, strict=True):
        for config in sorted({line["config"] for line in lines}):
            rows = [x for x in lines if x["metric"] == metric and x["config"] == config]
            rates = [x["rate"] for x in rows]
            errors = [
                [x["real"] - x["real_ci"][0] for x in rows],
                [x["real_ci"][1] - x["real"] for x in rows],
            ]
            reals = [x["real"] for x in rows]
            real = axis.errorbar(rates, reals, yerr=errors, fmt="o-", capsize=3, label=config)
            color = real.lines[0].get_color()
            axis.plot(rates, [x["sim"] for x in rows], "x--", color=color, label=f"{config} sim")
        axis.set_title(metric)
        axis.set_xlabel("requests/s")
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
