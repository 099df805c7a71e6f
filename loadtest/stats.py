"""ghz's summary statistics, computed the way ghz computes them (runner/reporter.go), and the
interval of a mean over repeated runs that the benchmarks report beside them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

PERCENTAGES = (10, 25, 50, 75, 90, 95, 99)
HISTOGRAM_BUCKETS = 10
Number = TypeVar("Number", int, float)


def percentile(sorted_values: Sequence[Number], percentage: int) -> Number:
    """ghz's rank rule: index int(p/100 * n), one lower when that product is a whole number."""
    if not sorted_values:
        raise ValueError("sorted_values: must not be empty")
    rank = percentage / 100.0 * len(sorted_values)
    index = int(rank) - 1 if rank == int(rank) else int(rank)
    return sorted_values[max(index, 0)]


def latency_distribution(sorted_ns: Sequence[int]) -> list[dict[str, int]]:
    """ghz's `latencyDistribution`: [{"percentage": 10, "latency": ns}, ...]."""
    if not sorted_ns:
        return []
    return [{"percentage": p, "latency": percentile(sorted_ns, p)} for p in PERCENTAGES]


def histogram(sorted_ns: Sequence[int]) -> list[dict[str, Any]]:
    """ghz's `histogram`: 11 marks (seconds) from fastest to slowest, a count and a frequency for
    each; a latency lands in the first bucket whose mark is >= it."""
    if not sorted_ns:
        return []
    seconds = [value / 1e9 for value in sorted_ns]
    fastest, slowest = seconds[0], seconds[-1]
    width = (slowest - fastest) / HISTOGRAM_BUCKETS
    marks = [fastest + width * i for i in range(HISTOGRAM_BUCKETS)] + [slowest]
    counts = [0] * len(marks)
    bucket = 0
    for value in seconds:
        while value > marks[bucket] and bucket < len(marks) - 1:
            bucket += 1
        counts[bucket] += 1
    return [
        {"mark": mark, "count": count, "frequency": count / len(seconds)}
        for mark, count in zip(marks, counts, strict=True)
    ]


def summary(values_ns: Sequence[int]) -> dict[str, Any]:
    """count / average / fastest / slowest / latencyDistribution of any set of durations (ns)."""
    ordered = sorted(values_ns)
    if not ordered:
        return {"count": 0, "average": 0, "fastest": 0, "slowest": 0, "latencyDistribution": []}
    return {
        "count": len(ordered),
        "average": round(sum(ordered) / len(ordered)),
        "fastest": ordered[0],
        "slowest": ordered[-1],
        "latencyDistribution": latency_distribution(ordered),
    }


# Two-sided 95 % quantiles of Student's t for 1..10 degrees of freedom (a table: the benchmarks need
# these few and would not pull scipy in for them); beyond 10 the normal 1.96 is within 12 %.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float


def mean_interval(values: Sequence[float]) -> Interval:
    """The mean and its 95 % t interval over repeats (one value: the interval is the value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, mean, mean)
    t = T_975[len(values) - 2] if len(values) - 1 <= len(T_975) else 1.96
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half)
