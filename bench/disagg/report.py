"""Per arm and rate: the figures `pdserve bench disagg` reports, its table and its plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.loadtest.report import GoodputTargets

NS_PER_S = 1e9


@dataclass(frozen=True)
class ArmResult:
    """The `--json` object (seconds, requests/s)."""

    arm: str
    rate: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    goodput: float
    completed: int

    @classmethod
    def from_report(cls, arm: str, rate: float, report: dict[str, Any]) -> ArmResult:
        generation = report["generation"]
        ttft, itl = generation["timeToFirstToken"], generation["interTokenLatency"]
        completed = report["statusCodeDistribution"].get("OK", 0)
        return cls(
            arm=arm,
            rate=rate,
            ttft_p50=_percentile(ttft, 50),
            ttft_p99=_percentile(ttft, 99),
            itl_p50=_percentile(itl, 50),
            itl_p99=_percentile(itl, 99),
            goodput=generation["goodput"]["rps"],
            completed=completed,
        )

    def line(self) -> str:
        return (
            f"{self.arm:<14} {self.rate:>5.2f} {self.ttft_p50:>8.2f} {self.ttft_p99:>8.2f} "
            f"{self.itl_p50 * 1e3:>8.0f} {self.itl_p99 * 1e3:>8.0f} {self.goodput:>8.3f} "
            f"{self.completed:>5}"
        )


def _percentile(summary: dict[str, Any], percentage: int) -> float:
    for mark in summary["latencyDistribution"]:
        if mark["percentage"] == percentage:
            return float(mark["latency"]) / NS_PER_S
    return float("nan")  # no request got that far (nothing completed)


def print_table(results: Sequence[ArmResult], targets: GoodputTargets) -> None:
    print(f"goodput SLOs: TTFT <= {targets.ttft_s} s and mean ITL <= {targets.itl_s} s")
    print(
        f"{'arm':<14} {'rate':>5} {'TTFT p50':>8} {'TTFT p99':>8} {'ITL p50':>8} {'ITL p99':>8} "
        f"{'goodput':>8} {'done':>5}"
    )
    print(f"{'':<14} {'req/s':>5} {'s':>8} {'s':>8} {'ms':>8} {'ms':>8} {'req/s':>8}")
    for result in results:
        print(result.line())


def plot_results(results: Sequence[ArmResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (itl_axes, ttft_axes) = plt.subplots(1, 2, figsize=(10, 4))
    for arm in dict.fromkeys(result.arm for result in results):
        points = [r for r in results if r.arm == arm]
        rates = [r.rate for r in points]
        itl_axes.plot(rates, [r.itl_p99 * 1e3 for r in points], marker="o", label=arm)
        ttft_axes.plot(rates, [r.ttft_p99 for r in points], marker="o", label=arm)
    itl_axes.set(xlabel="request rate (req/s)", ylabel="ITL p99 (ms)", title="inter-token latency")
    ttft_axes.set(xlabel="request rate (req/s)", ylabel="TTFT p99 (s)", title="time to first token")
    for axes in (itl_axes, ttft_axes):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
