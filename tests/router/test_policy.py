"""Least-loaded choice: queued first, then running, then KV use; round robin on exact ties."""

from __future__ import annotations

from collections import Counter

import pytest

from pdserve.router.placement.worker_choice import WorkerLoad, least_loaded, load_key

IDLE = WorkerLoad(num_free_blocks=100, num_total_blocks=100)


def test_fewest_queued_wins_over_fewer_running() -> None:
    loads = [
        WorkerLoad(num_waiting=1, num_running=0, num_free_blocks=100, num_total_blocks=100),
        WorkerLoad(num_waiting=0, num_running=9, num_free_blocks=10, num_total_blocks=100),
    ]
    assert least_loaded(loads, turn=0) == 1


def test_requests_sent_since_the_poll_count_as_queued() -> None:
    loads = [
        WorkerLoad(dispatched_since_poll=2, num_free_blocks=100, num_total_blocks=100),
        WorkerLoad(num_waiting=1, num_free_blocks=100, num_total_blocks=100),
    ]
    assert least_loaded(loads, turn=0) == 1


def test_fewer_running_then_more_free_blocks() -> None:
    running = [WorkerLoad(num_running=3), WorkerLoad(num_running=2), WorkerLoad(num_running=4)]
    assert least_loaded(running, turn=0) == 1
    blocks = [
        WorkerLoad(num_running=2, num_free_blocks=10, num_total_blocks=100),
        WorkerLoad(num_running=2, num_free_blocks=60, num_total_blocks=100),
    ]
    assert least_loaded(blocks, turn=0) == 1


def test_exact_ties_go_round_robin() -> None:
    loads = [IDLE, WorkerLoad(num_waiting=1), IDLE, IDLE]
    picks = Counter(least_loaded(loads, turn) for turn in range(30))
    assert picks == {0: 10, 2: 10, 3: 10}


def test_used_block_fraction_copes_with_odd_reports() -> None:
    assert WorkerLoad().used_block_fraction == 0.0  # no report yet
    assert WorkerLoad(num_free_blocks=7, num_total_blocks=5).used_block_fraction == 0.0
    assert load_key(WorkerLoad(num_waiting=1, num_running=2, dispatched_since_poll=3)) == (
        4,
        2,
        0.0,
    )


def test_no_worker_is_an_error_naming_loads() -> None:
    with pytest.raises(ValueError, match=r"^loads: "):
        least_loaded([], turn=0)
