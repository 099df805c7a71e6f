"""planner/autoscale_view.py: a decision sizes for the whole lookback while its arrivals read as
one steady rate, and for its newest part once they show the rate changed there."""

from __future__ import annotations

import pytest

from pdserve.planner.autoscale_observation import LengthHistogram, Observation
from pdserve.planner.autoscale_view import LoadViews, rate_tail

BOUNDS = (64.0, 1024.0)


def _seen(seconds: float, chat: float, long: float = 0.0) -> Observation:
    prompts, outputs = LengthHistogram(BOUNDS, (chat, long)), LengthHistogram(BOUNDS, (1.0, 0.0))
    return Observation(seconds, chat + long, prompts, outputs, in_flight=2)


def _views(*spans: tuple[float, float]) -> LoadViews:
    """Spans as (seconds, chat arrivals), shortest first."""
    return LoadViews(tuple(_seen(seconds, chat) for seconds, chat in spans))


@pytest.mark.parametrize(
    ("recent", "total", "unlikely"),
    [
        (15, 60, False),  # a steady 0.5 req/s: a quarter of the arrivals in a quarter of the span
        (0, 8, False),  # a lull in a surge at 0.07 req/s: 0 of 8 happens 10 % of the time
        (1, 46, True),  # the quiet after a busy phase: 1 where 11.5 were due
        (10, 16, True),  # a jump: 10 where 4 were due
    ],
)
def test_the_tail_is_small_only_for_a_share_one_rate_rarely_gives(
    recent: int, total: int, unlikely: bool
) -> None:
    assert (rate_tail(recent, total, share=0.25) < 0.002) is unlikely
    assert rate_tail(0, 0, share=0.25) == 1.0  # nothing to compare


def test_a_lull_in_a_low_rate_surge_keeps_the_lookback_and_its_mix() -> None:
    """One chat arrival in 30 s of a surge: sized alone it reads as chat only."""
    lookback = _seen(120.0, chat=3, long=5)
    views = LoadViews((_seen(30.0, chat=1), _seen(60.0, chat=2, long=2), lookback))
    assert views.steady() is lookback
    assert views.steady().prompt_tokens.counts == (3, 5)


def test_the_quiet_after_a_busy_phase_is_the_part_since_it_began() -> None:
    views = _views((30.0, 1), (45.0, 1), (60.0, 9), (120.0, 40))
    assert views.steady() is views.spans[1]  # 1 in 45 s where 15 were due: the clearest change


def test_a_jump_in_rate_is_the_part_since_it_began() -> None:
    views = _views((30.0, 12), (60.0, 13), (120.0, 16))
    assert views.steady() is views.spans[0]


def test_a_steady_rate_is_the_whole_lookback() -> None:
    views = _views((30.0, 14), (60.0, 31), (90.0, 44), (120.0, 60))
    assert views.steady() is views.spans[-1]


def test_before_the_lookback_is_longer_than_the_window_the_window_is_the_view() -> None:
    views = _views((20.0, 2))
    assert views.steady() is views.spans[0]
