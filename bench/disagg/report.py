"""Per arm and rate: the figures `pdserve bench disagg` reports, its table and its plot.

A point (arm, rate) pools the requests of its repeats for the latency percentiles (more requests,
steadier tails) and gives attainment as the mean over repeats with a 95 % t interval. ITL figures
are gaps between token-carrying stream chunks: a chunk that carries several tokens is one gap
(what a client sees); TPOT (attainment.py) divides by tokens instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdserve.bench.disagg.attainment import RequestOutcome, attainment
from pdserve.loadtest.stats import mean_interval, percentile


@dataclass(frozen=True)
class PointCounters:
    """What the cluster counted during one repeat of a point (deltas of its /metrics)."""

    placements: Mapping[str, int]  # {"local": n, "remote": n}
    reasons: Mapping[str, int]  # {"local:prefill_idle": n, ...}: place and reason
    prefix_hit_tokens: int  # prompt tokens found in a prefix cache, summed over workers
    # worker name -> (seconds between its streams' tokens, summed; how many such gaps)
    itl: Mapping[str, tuple[float, float]]


@dataclass(frozen=True)
class Repeat:
    outcomes: tuple[RequestOutcome, ...]
    counters: PointCounters


@dataclass(frozen=True)
class ArmResult:
    """The `--json` object of one point (seconds; rates and goodput in requests/s)."""

    arm: str
    rate: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    goodput: float  # good requests per second of offered load: mean attainment x rate
    completed: int
    attainment: float
    attainment_ci: tuple[float, float]
    repeats: int
    requests: int
    placements: dict[str, int]
    prefix_hit_tokens: int
    # "place:reason" -> requests (router/placement/prefill_place.py PlacementReason): which worker
    # the adaptive arm chose and why (local:local_cheaper on a decode worker, local:prefill_idle and
    # local:lent_prefill_worker on the prefill worker, remote:*).
    placement_reasons: dict[str, int]
    # worker name ("decode-0", "prefill-0") -> its streams' mean gap between tokens, s (its
    # decode metrics: a lent prefill worker's streams count there): which worker decoded slower
    itl_mean_by_worker: dict[str, float]
    tpot_p50: float
    tpot_p99: float
    attainment_by_class: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, arm: str, rate: float, repeats: Sequence[Repeat]) -> ArmResult:
        pooled = [o for repeat in repeats for o in repeat.outcomes]
        interval = mean_interval([attainment(repeat.outcomes) for repeat in repeats])
        ttfts = sorted(o.ttft_s for o in pooled if o.ttft_s is not None)
        gaps = sorted(gap for o in pooled for gap in o.itl_gaps_s)
        tpots = sorted(o.tpot_s for o in pooled if o.tpot_s is not None)
        placements = _summed({"local": 0, "remote": 0}, [r.counters.placements for r in repeats])
        reasons = _summed({}, [repeat.counters.reasons for repeat in repeats])
        classes = sorted({o.class_name for o in pooled})
        return cls(
            arm=arm,
            rate=rate,
            ttft_p50=_percentile(ttfts, 50),
            ttft_p99=_percentile(ttfts, 99),
            itl_p50=_percentile(gaps, 50),
            itl_p99=_percentile(gaps, 99),
            goodput=interval.mean * rate,
            completed=sum(o.completed for o in pooled),
            attainment=interval.mean,
            # A fraction: Student t over 3 repeats can reach past [0, 1]; the truth cannot.
            attainment_ci=(max(0.0, interval.low), min(1.0, interval.high)),
            repeats=len(repeats),
            requests=len(pooled),
            placements=placements,
            placement_reasons=reasons,
            itl_mean_by_worker=_mean_gaps([repeat.counters.itl for repeat in repeats]),
            prefix_hit_tokens=sum(repeat.counters.prefix_hit_tokens for repeat in repeats),
            tpot_p50=_percentile(tpots, 50),
            tpot_p99=_percentile(tpots, 99),
            attainment_by_class={
                name: attainment([o for o in pooled if o.class_name == name]) for name in classes
            },
        )

    def line(self) -> str:
        low, high = self.attainment_ci
        return (
            f"{self.arm:<14} {self.rate:>5.2f} {self.ttft_p50:>8.2f} {self.ttft_p99:>8.2f} "
            f"{self.itl_p50 * 1e3:>7.0f} {self.itl_p99 * 1e3:>7.0f} {self.tpot_p50 * 1e3:>7.0f} "
            f"{self.attainment:>6.2f} [{low:>5.2f},{high:>5.2f}] {self.goodput:>7.3f} "
            f"{self.completed:>4}/{self.requests:<4} {self.placements['local']:>5}"
            f"/{self.placements['remote']:<5} {self.prefix_hit_tokens:>7}"
        )


def _percentile(sorted_values: Sequence[float], percentage: int) -> float:
    return percentile(sorted_values, percentage) if sorted_values else float("nan")


def print_header(slo_text: str) -> None:
    print(slo_text)
    print(
        f"{'arm':<14} {'rate':>5} {'TTFT p50':>8} {'TTFT p99':>8} {'ITL p50':>7} {'ITL p99':>7} "
        f"{'TPOT50':>7} {'attain':>6} {'95% interval':>13} {'goodput':>7} {'done/req':>9} "
        f"{'local/remote':>11} {'hit tok':>7}"
    )
    print(f"{'':<14} {'req/s':>5} {'s':>8} {'s':>8} {'ms':>7} {'ms':>7} {'ms':>7}")


def plot_results(results: Sequence[ArmResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (attain_axes, itl_axes, ttft_axes) = plt.subplots(1, 3, figsize=(14, 4))
    for arm in dict.fromkeys(result.arm for result in results):
        points = [r for r in results if r.arm == arm]
        rates = [r.rate for r in points]
        errors = [
            [r.attainment - r.attainment_ci[0] for r in points],
            [r.attainment_ci[1] - r.attainment for r in points],
        ]
        attain_axes.errorbar(
            rates, [r.attainment for r in points], yerr=errors, marker="o", capsize=3, label=arm
        )
        itl_axes.plot(rates, [r.itl_p99 * 1e3 for r in points], marker="o", label=arm)
        ttft_axes.plot(rates, [r.ttft_p99 for r in points], marker="o", label=arm)
    attain_axes.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    attain_axes.set(xlabel="request rate (req/s)", ylabel="SLO attainment", title="attainment")
    itl_axes.set(xlabel="request rate (req/s)", ylabel="ITL p99 (ms)", title="inter-token latency")
    ttft_axes.set(xlabel="request rate (req/s)", ylabel="TTFT p99 (s)", title="time to first token")
    for axes in (attain_axes, itl_axes, ttft_axes):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _summed(start: dict[str, int], counts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    summed = dict(start)
    for count in counts:
        for key, value in count.items():
            summed[key] = summed.get(key, 0) + value
    return summed


def _mean_gaps(counts: Sequence[Mapping[str, tuple[float, float]]]) -> dict[str, float]:
    """Per worker, the mean gap over every repeat (workers that streamed nothing left out)."""
    totals: dict[str, tuple[float, float]] = {}
    for count in counts:
        for name, (seconds, gaps) in count.items():
            before = totals.get(name, (0.0, 0.0))
            totals[name] = (before[0] + seconds, before[1] + gaps)
    return {name: seconds / gaps for name, (seconds, gaps) in totals.items() if gaps}
