"""`pdserve bench disagg`'s request plan, SLO attainment and report, without a cluster."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from pdserve.bench.disagg.arms import ARMS, worker_and_router_flags
from pdserve.bench.disagg.attainment import (
    RequestOutcome,
    goodput_rate,
    outcome,
    outcomes,
    record,
)
from pdserve.bench.disagg.cli import (
    MIXES,
    BenchSettings,
    _wide_intervals,
    plan_points,
    turn_order,
)
from pdserve.bench.disagg.report import ArmResult, PointCounters, Repeat
from pdserve.bench.disagg.workload import (
    DEFAULT_SPEC,
    PlannedRequest,
    load_spec,
    parse_spec,
    plan_requests,
    point_seed,
)
from pdserve.loadtest.calls import CallResult
from pdserve.loadtest.stats import mean_interval

VOCAB = 49152
BLOCK = 16


def _settings(**overrides: Any) -> BenchSettings:
    values: dict[str, Any] = {
        "rates": (0.1, 0.2, 0.3, 0.4),
        "duration_s": 60.0,
        "repeats": 3,
        "seed": 0,
        "tpot_slo_s": 0.15,
        "threshold": 512,
        "chunk_tokens": 512,
        "profile": Path("profile.json"),
    }
    values.update(overrides)
    return BenchSettings(**values)


def test_no_prompt_repeats_within_a_run_nor_shares_a_block() -> None:
    points = plan_points(parse_spec(DEFAULT_SPEC), _settings(), VOCAB)
    assert len(points) == 4 * 3
    prompts = [request.prompt for point in points for request in point.plan]
    assert len(prompts) == sum(round(rate * 60) for rate in (0.1, 0.2, 0.3, 0.4)) * 3
    first_blocks = {prompt[:BLOCK] for prompt in prompts}
    assert len(first_blocks) == len(prompts)  # nothing for the prefix cache to find
    assert len({point.schedule_seed for point in points}) == len(points)  # fresh arrivals too


def test_every_arm_gets_the_same_points() -> None:
    classes = parse_spec(DEFAULT_SPEC)
    assert plan_points(classes, _settings(), VOCAB) == plan_points(classes, _settings(), VOCAB)
    other_seed = plan_points(classes, _settings(seed=1), VOCAB)
    assert other_seed[0].plan != plan_points(classes, _settings(), VOCAB)[0].plan


def test_arms_take_turns_in_a_rotating_order() -> None:
    """Each arm runs first in some repeat: a host's drift weighs on every arm alike."""
    arms = [ARMS["colocated"], ARMS["adaptive"], ARMS["disaggregated"]]
    orders = [[arm.name for arm in turn_order(arms, repeat)] for repeat in range(4)]
    assert orders == [
        ["colocated", "adaptive", "disaggregated"],
        ["adaptive", "disaggregated", "colocated"],
        ["disaggregated", "colocated", "adaptive"],
        ["colocated", "adaptive", "disaggregated"],
    ]


def test_a_shared_prefix_is_shared_within_a_point_and_fresh_across_points() -> None:
    spec = {
        "classes": [
            {
                "name": "rag",
                "prompt_tokens": {"min": 100, "max": 120},
                "output_tokens": {"min": 4, "max": 4},
                "ttft_slo": {"seconds": 1.0},
                "shared_prefix": {"groups": 2, "tokens": 64},
            }
        ]
    }
    classes = parse_spec(spec)
    first = plan_requests(classes, 20, VOCAB, point_seed(0, "a"))
    second = plan_requests(classes, 20, VOCAB, point_seed(0, "b"))
    prefixes_first = {r.prompt[:64] for r in first}
    assert len(prefixes_first) == 2  # both groups drawn, each shared by several requests
    assert len({r.prompt[64:] for r in first}) == 20  # the rest of each prompt is its own
    assert prefixes_first.isdisjoint({r.prompt[:64] for r in second})


def test_ttft_slo_grows_with_the_prompt_where_the_class_says_so() -> None:
    classes = parse_spec(DEFAULT_SPEC)
    for request in plan_requests(classes, 50, VOCAB, point_seed(0, "slo")):
        if request.class_name == "long":
            assert request.ttft_slo_s == pytest.approx(4.0 + 0.012 * len(request.prompt))
        else:
            assert request.ttft_slo_s == 2.0


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"classes": []}, "classes"),
        ({"classes": [{"prompt_tokens": {"min": 1, "max": 2}}]}, "classes[0].output_tokens"),
        (
            {
                "classes": [
                    {
                        "prompt_tokens": {"min": 1, "max": 2},
                        "output_tokens": {"min": 1, "max": 2},
                        "ttft_slo": {"seconds": -1},
                    }
                ]
            },
            "classes[0].ttft_slo.seconds",
        ),
        (
            {
                "classes": [
                    {
                        "prompt_tokens": {"min": 10, "max": 20},
                        "output_tokens": {"min": 1, "max": 2},
                        "ttft_slo": {"seconds": 1},
                        "shared_prefix": {"groups": 1, "tokens": 10},
                    }
                ]
            },
            "classes[0].shared_prefix.tokens",
        ),
    ],
)
def test_a_bad_spec_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(raw)


def _planned(ttft_slo_s: float = 1.0) -> PlannedRequest:
    return PlannedRequest("chat", (100, 101), 5, ttft_slo_s)


def _result(first_s: float, gaps_s: tuple[float, ...], tokens: int, number: int = 0) -> CallResult:
    return CallResult(
        started_at=0.0,
        latency_ns=1,
        status="OK",
        output_tokens=tokens,
        first_token_ns=int(first_s * 1e9),
        token_gaps_ns=tuple(int(g * 1e9) for g in gaps_s),
        request_number=number,
    )


def test_tpot_divides_by_tokens_so_a_chunk_of_several_counts_for_each() -> None:
    # 5 tokens in 3 chunks (1, 2, 2): 4 tokens after the first over 0.4 s -> TPOT 0.1 s.
    fast = outcome(_planned(), _result(0.5, (0.2, 0.2), tokens=5), tpot_slo_s=0.1)
    assert fast.tpot_s == pytest.approx(0.1)
    assert fast.meets_slo
    assert not outcome(_planned(), _result(0.5, (0.2, 0.2), 5), tpot_slo_s=0.09).meets_slo
    assert not outcome(_planned(0.4), _result(0.5, (0.2, 0.2), 5), tpot_slo_s=1).meets_slo


def test_a_request_log_line_carries_the_id_the_router_logs() -> None:
    planned = _planned()
    assert "request_id" not in planned.call_data()
    assert planned.call_data(request_id="r0.3-1-4")["request_id"] == "r0.3-1-4"
    line = record(planned, outcome(planned, _result(0.5, (0.2, 0.2), tokens=5), tpot_slo_s=0.1))
    assert line["class"] == planned.class_name and line["meets_slo"] is True
    assert line["tpot_s"] == pytest.approx(0.1)


def test_a_failed_request_misses_and_every_planned_request_is_accounted() -> None:
    failed = CallResult(0.0, 1, "Unavailable", "rpc error", request_number=1)
    found = outcomes([_planned(), _planned()], [_result(0.1, (), 1, number=0), failed], 1.0)
    assert [o.meets_slo for o in found] == [True, False]
    with pytest.raises(ValueError):
        outcomes([_planned(), _planned()], [_result(0.1, (), 1, number=0)], 1.0)


def test_goodput_rate_is_the_last_rate_before_the_first_miss() -> None:
    assert goodput_rate([(0.1, 1.0), (0.2, 0.95), (0.3, 0.5), (0.4, 0.92)]) == 0.2
    assert goodput_rate([(0.1, 0.8), (0.2, 1.0)]) == 0.0
    assert goodput_rate([(0.2, 0.9), (0.1, 1.0)]) == 0.2


def test_the_interval_is_students_t_over_repeats() -> None:
    interval = mean_interval([0.8, 0.9, 1.0])
    assert interval.mean == pytest.approx(0.9)
    assert interval.high - interval.mean == pytest.approx(4.303 * 0.1 / 3**0.5, rel=1e-3)
    assert mean_interval([0.7]).low == 0.7


def repeat(meets: list[bool], hits: int = 0) -> Repeat:
    """One repeat of a point whose requests met their SLOs or not, as `meets` says."""
    made = [
        RequestOutcome("chat", True, 0.1 * (i + 1), 0.05, (0.05,), ok) for i, ok in enumerate(meets)
    ]
    placements = {"local": 0, "remote": len(meets)}
    reasons = {"remote:remote_faster": len(meets)}
    itl = {"decode-0": (0.1 * len(meets), float(len(meets))), "prefill-0": (0.0, 0.0)}
    return Repeat(tuple(made), PointCounters(placements, reasons, hits, itl))


def test_a_point_pools_its_repeats() -> None:
    row = ArmResult.of("disaggregated", 0.5, [repeat([True, True], 0), repeat([True, False], 32)])
    assert (row.repeats, row.requests, row.completed) == (2, 4, 4)
    assert row.attainment == pytest.approx(0.75)
    assert row.goodput == pytest.approx(0.375)
    assert row.placements == {"local": 0, "remote": 4}
    assert row.placement_reasons == {"remote:remote_faster": 4}
    assert row.itl_mean_by_worker == {"decode-0": pytest.approx(0.1)}  # prefill-0 streamed none
    assert row.prefix_hit_tokens == 32
    assert row.attainment_by_class == {"chat": 0.75}
    low, high = row.attainment_ci
    assert low < 0.75 < high


def test_a_point_holds_rate_times_duration_requests() -> None:
    points = plan_points(parse_spec(DEFAULT_SPEC), _settings(repeats=1), VOCAB)
    sizes = [len(point.plan) for point in points]
    assert sizes == [6, 12, 18, 24]
    assert all(a != b for a, b in itertools.pairwise(point.plan for point in points))


def test_the_adaptive_arm_steps_within_the_itl_slo_unless_it_is_zero() -> None:

    def flags(itl_slo: float | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return worker_and_router_flags(ARMS["adaptive"], _settings(itl_slo_s=itl_slo).arms)

    workers, router = flags(None)
    assert router[-2:] == ("--itl-slo", "0.15")  # the TPOT SLO by default
    assert workers[-4:] == ("--itl-slo", "0.15", "--itl-slo-mode", "mean")
    assert flags(0.1)[0][-4:-2] == ("--itl-slo", "0.1")
    workers, router = flags(0.0)
    assert "--itl-slo" not in workers + router
    assert "--profile" in workers and router[:2] == ("--placement", "adaptive")


def test_more_repeats_run_until_every_interval_ranks_the_arms() -> None:
    """Attainments 1.0, 0.9, 1.0, 0.9: within 0.18 (Student t, 3 degrees of freedom); 1.0 and
    0.9 alone: 0.68 wide (t with one degree of freedom is 12.7); one repeat has no interval."""
    settings = _settings(max_repeats=8)
    full, one_missed = repeat([True] * 10), repeat([True] * 9 + [False])
    steady = {0.5: [full, one_missed, full, one_missed]}
    swinging = {0.5: [full, one_missed]}
    assert not _wide_intervals({"colocated": steady}, settings)
    assert _wide_intervals({"colocated": steady, "adaptive": swinging}, settings)
    assert _wide_intervals({"colocated": {0.5: [repeat([True] * 10)]}}, settings)
    assert settings.most_repeats == 8 and _settings().most_repeats == 3


@pytest.mark.parametrize(("mix", "chat_share"), [("chat-heavy", 0.95), ("long-heavy", 0.4)])
def test_the_shipped_mixes_load(mix: str, chat_share: float) -> None:
    chat, long = load_spec(MIXES[mix])
    assert (chat.name, long.name) == ("chat", "long")
    assert chat.weight / (chat.weight + long.weight) == pytest.approx(chat_share)
