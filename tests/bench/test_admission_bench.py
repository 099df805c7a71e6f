"""`pdserve bench admission`'s arithmetic on made-up outcomes (its arms run clusters of real
processes, minutes each; the admission paths themselves are tested through the router in
tests/router and through real processes in tests/integration/test_predictions.py)."""

from __future__ import annotations

import math

import pytest

from pdserve.bench.admission.cli import RowKey, Served, _median_error, _row
from pdserve.bench.admission.tenants import (
    ALONE,
    FLOOD,
    SHARED,
    Flood,
    TenantLoad,
    scenarios,
    tenant_loads,
)
from pdserve.bench.disagg.attainment import RequestOutcome
from pdserve.bench.disagg.cli import Point
from pdserve.bench.disagg.workload import DEFAULT_SPEC, parse_spec
from pdserve.router.tenants import parse_tenants


def outcome(meets: bool, ttft: float | None = 0.5, completed: bool = True) -> RequestOutcome:
    return RequestOutcome("chat", completed, ttft, 0.1 if ttft else None, (), meets)


def test_rows_judge_admitted_requests_and_count_goodput_over_every_arrival() -> None:
    first = Served(
        (outcome(True), outcome(False, ttft=3.0), outcome(False, ttft=None, completed=False)),
        (False, False, True),
        0.1,
    )
    second = Served((outcome(True), outcome(True)), (False, False), math.nan)
    row = _row(RowKey("predict", 0.5), [first, second], duration_s=10.0)
    assert row.attainment_admitted == pytest.approx(3 / 4)  # the refused one is not judged
    assert row.rejected_fraction == pytest.approx(1 / 5)
    assert row.goodput == pytest.approx(3 / 20)  # met SLOs per second of arrivals, both repeats
    assert row.ttft_p99_admitted == 3.0
    assert row.prediction_error_p50 == 0.1  # the repeat that judged none does not count
    # Intervals over the repeats' own values (1/2 and 1 admitted met; 0.1 and 0.2 req/s),
    # clipped to what the quantity can be.
    assert row.attainment_admitted_ci[0] == 0.0 and row.attainment_admitted_ci[1] == 1.0
    low, high = row.goodput_ci
    assert low == 0.0 and high == pytest.approx(0.15 + 12.706 * 0.05)
    assert _row(RowKey("queue", 0.5), [first], 10.0).prediction_error_p50 is None


def test_the_median_error_is_read_from_the_histogram_buckets() -> None:
    before = {0.5: 1.0, 1.0: 2.0, 1.25: 2.0, math.inf: 2.0}
    after = {0.5: 1.0, 1.0: 3.0, 1.25: 6.0, math.inf: 6.0}  # 4 new: 1 at <= 1.0, 3 at <= 1.25
    assert _median_error(before, after) == pytest.approx(0.25)
    assert math.isnan(_median_error(after, after))


def _point(rate: float) -> Point:
    return Point(rate, 0, (), 0)


def test_each_tenant_sends_its_weighted_share_and_the_flooder_five_times_it() -> None:
    config = parse_tenants(
        {"tenants": {"alice": {"weight": 1}, "bob": {"weight": 1}, "batch": {"weight": 2}}}, "t"
    )
    classes = parse_spec(DEFAULT_SPEC)
    flood = Flood("bob", 5.0)

    def loads(scenario: str) -> dict[str, TenantLoad]:
        found = tenant_loads(_point(0.4), config, classes, 100.0, 1000, 0, flood, scenario)
        return {load.tenant: load for load in found}

    alone, flooded = loads(ALONE), loads(FLOOD)
    assert set(alone) == {"alice", "batch"}  # the flooder is silent alone
    assert alone["alice"].rate == pytest.approx(0.1) and alone["batch"].rate == pytest.approx(0.2)
    assert flooded["bob"].rate == pytest.approx(0.5) and len(flooded["bob"].plan) == 50
    for tenant in ("alice", "batch"):  # the same requests at the same arrivals both times
        assert flooded[tenant] == alone[tenant]
    assert alone["alice"].plan != alone["batch"].plan[: len(alone["alice"].plan)]
    assert scenarios(None) == (SHARED,)
