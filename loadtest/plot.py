"""PNG plots of load reports (matplotlib's Agg canvas through Figure, no pyplot global state)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from pdserve.loadtest.sweep import SweepPoint

SWEEP_PERCENTAGES = (50, 90, 99)
NS_PER_MS = 1e6


def _percentiles_ms(distribution: list[dict[str, int]]) -> dict[int, float]:
    return {entry["percentage"]: entry["latency"] / NS_PER_MS for entry in distribution}


def plot_report(report: dict[str, Any], path: Path) -> None:
    """Latency percentiles of one run (and time to first token for streams)."""
    figure = Figure(figsize=(7, 4), layout="constrained")
    axes = figure.add_subplot()
    series = {"latency": report["latencyDistribution"]}
    ttft = report.get("generation", {}).get("timeToFirstToken")
    if ttft:
        series["time to first token"] = ttft["latencyDistribution"]
    for label, distribution in series.items():
        points = _percentiles_ms(distribution)
        axes.plot(list(points), list(points.values()), marker="o", label=label)
    axes.set_xlabel("percentile")
    axes.set_ylabel("ms")
    axes.set_title(f"{report['options']['call']}: {report['count']} calls, {report['rps']:.1f} rps")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.savefig(path, format="png", dpi=100)


def plot_sweep(points: Sequence[SweepPoint], path: Path) -> None:
    """Latency percentiles (top) and achieved throughput (bottom) against offered load."""
    if not points:
        raise ValueError("points: a sweep plot needs at least one run")
    figure = Figure(figsize=(7, 7), layout="constrained")
    latency_axes, throughput_axes = figure.subplots(2, 1, sharex=True)
    offered = [point.offered_rps for point in points]
    _plot_latencies(latency_axes, points, offered)
    throughput_axes.plot(offered, [p.report["rps"] for p in points], marker="o", label="achieved")
    if "goodput" in points[0].report["generation"]:
        goodput = [p.report["generation"]["goodput"]["rps"] for p in points]
        throughput_axes.plot(offered, goodput, marker="s", label="goodput")
    throughput_axes.plot(offered, offered, linestyle=":", color="grey", label="offered")
    throughput_axes.set_xlabel("offered load (requests/s)")
    throughput_axes.set_ylabel("requests/s")
    throughput_axes.grid(True, alpha=0.3)
    throughput_axes.legend()
    figure.savefig(path, format="png", dpi=100)


def _plot_latencies(axes: Any, points: Sequence[SweepPoint], offered: list[float]) -> None:
    stream = "timeToFirstToken" in points[0].report["generation"]
    for percentage in SWEEP_PERCENTAGES:
        latency = [_percentiles_ms(p.report["latencyDistribution"]).get(percentage) for p in points]
        axes.plot(offered, latency, marker="o", label=f"latency p{percentage}")
        if stream:
            ttft = [
                _percentiles_ms(
                    p.report["generation"]["timeToFirstToken"]["latencyDistribution"]
                ).get(percentage)
                for p in points
            ]
            axes.plot(offered, ttft, marker="x", linestyle="--", label=f"TTFT p{percentage}")
    axes.set_ylabel("ms")
    axes.set_title(f"{points[0].report['options']['call']}: latency against offered load")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
