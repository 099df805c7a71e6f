"""Printing, JSON lines and the plot of offline benchmark runs."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.offline.engines import EngineKind, EngineRun

# The ratios the issue asks for, numerator first.
RATIO_PAIRS = (
    (EngineKind.CONTINUOUS, EngineKind.STATIC),
    (EngineKind.CONTINUOUS, EngineKind.HF),
    (EngineKind.STATIC, EngineKind.HF),
)


@dataclass(frozen=True)
class Summary:
    """Every repeat of one engine at one max batch size."""

    engine: EngineKind
    max_batch: int
    tokens_per_s: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.tokens_per_s)

    @property
    def spread_pct(self) -> float:
        """(max - min) / mean, in percent: how far apart the repeats landed."""
        return 100 * (max(self.tokens_per_s) - min(self.tokens_per_s)) / self.mean


def summarize(runs: Iterable[EngineRun]) -> list[Summary]:
    def key(run: EngineRun) -> tuple[int, int]:
        return run.max_batch, list(EngineKind).index(run.engine)

    return [
        Summary(group[0].engine, group[0].max_batch, tuple(r.tokens_per_s for r in group))
        for _, grouped in itertools.groupby(sorted(runs, key=key), key=key)
        for group in [list(grouped)]
    ]


def json_line(run: EngineRun, workload: str, extra: Mapping[str, object]) -> str:
    record: dict[str, object] = {
        "engine": run.engine.value,
        "max_batch": run.max_batch,
        "repeat": run.repeat,
        "workload": workload,
        "num_requests": run.num_requests,
        "output_tokens": run.output_tokens,
        "seconds": round(run.seconds, 4),
        "tokens_per_s": round(run.tokens_per_s, 2),
        "cpu_seconds": round(run.cpu_seconds, 3),
        "tokens_per_cpu_s": round(run.tokens_per_cpu_s, 2),
        "load_seconds": round(run.load_seconds, 3),
    }
    return json.dumps({**record, **extra})


def run_line(run: EngineRun) -> str:
    return (
        f"{run.engine.value:>10}  B={run.max_batch:<3} repeat {run.repeat}: "
        f"{run.output_tokens} tokens in {run.seconds:.2f} s = {run.tokens_per_s:.1f} tok/s "
        f"(CPU {run.cpu_seconds:.1f} s, {run.tokens_per_cpu_s:.1f} tok/CPU-s)"
    )


def summary_table(summaries: list[Summary]) -> str:
    lines = [f"{'engine':>10}  {'B':>3}  {'tok/s (mean)':>12}  {'runs':<24} spread"]
    for s in summaries:
        runs = ", ".join(f"{value:.1f}" for value in s.tokens_per_s)
        lines.append(
            f"{s.engine.value:>10}  {s.max_batch:>3}  {s.mean:>12.1f}  {runs:<24} "
            f"{s.spread_pct:.1f}%"
        )
    return "\n".join(lines)


def ratio_table(summaries: list[Summary]) -> str:
    """Ratios of mean tokens/s between engines measured in the same run, per max batch size."""
    by_key = {(s.engine, s.max_batch): s for s in summaries}
    lines = []
    for max_batch in sorted({s.max_batch for s in summaries}):
        for top, bottom in RATIO_PAIRS:
            if (top, max_batch) in by_key and (bottom, max_batch) in by_key:
                ratio = by_key[top, max_batch].mean / by_key[bottom, max_batch].mean
                lines.append(f"B={max_batch:<3} {top.value}/{bottom.value}: {ratio:.2f}x")
    return "\n".join(lines) if lines else "(no two engines at the same max batch to compare)"


def plot(summaries: list[Summary], path: Path, title: str) -> None:
    """Tokens/s against max batch size, one line per engine (min-max of repeats as bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for engine in EngineKind:
        points = sorted((s for s in summaries if s.engine is engine), key=lambda s: s.max_batch)
        if not points:
            continue
        means = [p.mean for p in points]
        errors = [
            [m - min(p.tokens_per_s) for m, p in zip(means, points, strict=True)],
            [max(p.tokens_per_s) - m for m, p in zip(means, points, strict=True)],
        ]
        axes.errorbar(
            [p.max_batch for p in points],
            means,
            yerr=errors,
            marker="o",
            capsize=3,
            label=engine.value,
        )
    axes.set_xscale("log", base=2)
    batches = sorted({s.max_batch for s in summaries})
    axes.set_xticks(batches, [str(b) for b in batches])
    axes.minorticks_off()
    axes.set_xlabel("max batch size")
    axes.set_ylabel("output tokens/s")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
