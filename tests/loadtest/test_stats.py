"""ghz's percentile and histogram rules, checked on hand-worked examples."""

from __future__ import annotations

import pytest

from pdserve.loadtest.stats import histogram, latency_distribution, percentile, summary


def test_percentile_uses_ghz_rank_rule() -> None:
    values = list(range(1, 11))  # 1..10
    # p50: 0.5 * 10 = 5.0 is whole -> index 4 -> 5; p95: 9.5 -> index 9 -> 10; p10: 1.0 -> index 0
    assert percentile(values, 50) == 5
    assert percentile(values, 95) == 10
    assert percentile(values, 10) == 1
    assert percentile([7], 99) == 7
    with pytest.raises(ValueError, match="sorted_values"):
        percentile([], 50)


def test_latency_distribution_lists_ghz_percentages() -> None:
    distribution = latency_distribution(list(range(100, 1100, 100)))
    assert [entry["percentage"] for entry in distribution] == [10, 25, 50, 75, 90, 95, 99]
    assert [entry["latency"] for entry in distribution] == [100, 300, 500, 800, 900, 1000, 1000]
    assert latency_distribution([]) == []


def test_histogram_has_eleven_marks_in_seconds_and_counts_every_value() -> None:
    values_ns = [1_000_000_000, 1_000_000_000, 1_500_000_000, 2_000_000_000]
    buckets = histogram(values_ns)
    assert len(buckets) == 11
    assert buckets[0]["mark"] == pytest.approx(1.0) and buckets[-1]["mark"] == pytest.approx(2.0)
    counts = [bucket["count"] for bucket in buckets]
    assert counts[0] == 2 and counts[5] == 1 and counts[10] == 1 and sum(counts) == 4
    assert sum(bucket["frequency"] for bucket in buckets) == pytest.approx(1.0)


def test_summary() -> None:
    assert summary([3, 1, 2]) | {"latencyDistribution": None} == {
        "count": 3,
        "average": 2,
        "fastest": 1,
        "slowest": 3,
        "latencyDistribution": None,
    }
    assert summary([])["count"] == 0
