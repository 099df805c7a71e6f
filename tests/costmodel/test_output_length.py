"""Output-length forecasts (costmodel/output_length.py): learned from finished streams by their
max_tokens group, conditional on what a stream has generated, never past its limit."""

from __future__ import annotations

import random

from pdserve.costmodel.output_length import MIN_FINISHED, OutputLengths


def test_without_finished_streams_the_limit_is_the_forecast() -> None:
    lengths = OutputLengths()
    assert lengths.remaining(4096) == 4096
    assert lengths.remaining(4096, generated=100) == 3996
    for _ in range(MIN_FINISHED - 1):
        lengths.record(4096, 50)
    assert lengths.remaining(4096) == 4096  # one too few


def test_a_forecast_is_the_mean_of_what_longer_streams_generated_after_that_point() -> None:
    lengths = OutputLengths()
    for length in (20, 40, 60, 80) * 3:
        lengths.record(4096, length)
    assert lengths.remaining(4096) == 50  # all twelve: mean 50
    assert lengths.remaining(4096, generated=30) == 30  # 40, 60, 80 (nine): mean 60, 30 done
    assert lengths.remaining(4096, generated=70) == 4026  # three past 70: too few, the limit


def test_a_forecast_never_exceeds_what_the_limit_leaves() -> None:
    lengths = OutputLengths()
    for _ in range(MIN_FINISHED):
        lengths.record(1000, 900)
    assert lengths.remaining(600) == 600  # same group (513..1024), a lower limit


def test_groups_by_limit_are_apart() -> None:
    lengths = OutputLengths()
    for _ in range(MIN_FINISHED):
        lengths.record(4096, 30)
    assert lengths.remaining(4096) == 30
    assert lengths.remaining(16) == 16 and lengths.remaining(2048) == 2048


def test_old_streams_leave_the_window() -> None:
    lengths = OutputLengths(window=MIN_FINISHED)
    for _ in range(MIN_FINISHED):
        lengths.record(256, 200)
    for _ in range(MIN_FINISHED):
        lengths.record(256, 10)
    assert lengths.remaining(256) == 10


def test_the_forecast_matches_a_brute_force_mean_residual() -> None:
    rng = random.Random(1)
    lengths = OutputLengths(window=64)
    seen: list[int] = []
    for _ in range(300):
        length = rng.randint(1, 500)
        lengths.record(512, length)
        seen = [*seen, length][-64:]
        done = rng.randint(0, 400)
        longer = [x for x in seen if x > done]
        enough = len(longer) >= MIN_FINISHED
        expected = round(sum(longer) / len(longer) - done) if enough else 512 - done
        assert lengths.remaining(512, done) == min(expected, 512 - done)
