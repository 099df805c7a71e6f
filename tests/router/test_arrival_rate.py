"""The router's count of requests placed a second (placement/arrival_rate.py)."""

from __future__ import annotations

import pytest

from pdserve.router.placement.arrival_rate import MIN_SPAN_S, ArrivalRate


def test_nothing_placed_is_no_rate() -> None:
    assert ArrivalRate().per_second(100.0) == 0.0


def test_the_rate_is_the_windows_count_over_the_time_it_spans() -> None:
    rate = ArrivalRate(window_s=60.0)
    for second in range(0, 120, 5):  # one every 5 s for two minutes
        rate.record(float(second))
    assert rate.per_second(119.0) == pytest.approx(12 / 59)  # 60, 65, ..., 115: 59 s to now


def test_requests_older_than_the_window_are_forgotten() -> None:
    rate = ArrivalRate(window_s=60.0)
    for second in range(10):
        rate.record(float(second))
    assert rate.per_second(200.0) == 0.0


def test_a_few_requests_close_together_are_not_read_as_a_burst() -> None:
    """Two requests a second apart: 2 over the minimum span, not 2 a second."""
    rate = ArrivalRate()
    rate.record(0.0)
    rate.record(1.0)
    assert rate.per_second(1.0) == pytest.approx(2 / MIN_SPAN_S)


def test_a_burst_after_a_quiet_minute_is_read_at_its_own_rate() -> None:
    """One request, 50 quiet seconds, then one every 5 s: the rate the burst arrives at, not
    its requests spread over the quiet part of the window."""
    rate = ArrivalRate(window_s=60.0)
    rate.record(0.0)
    for second in (61.0, 66.0, 71.0, 76.0):
        rate.record(second)
    assert rate.per_second(80.0) == pytest.approx(4 / 19)
