"""`pdserve bench autoscale`'s arms, trace and per-phase arithmetic on made-up samples (its arms
run `pdserve up --netns` for the trace's length each; the autoscaler itself is tested through
real pods in tests/chaos/test_elastic.py)."""

from __future__ import annotations

import argparse
import json

import pytest

from pdserve.bench.autoscale.cli import (
    AUTOSCALE,
    AUTOSCALE_COLOCATED,
    PhaseRow,
    Window,
    _row,
    _summary,
    fixed_shapes,
    parse_arms,
    parse_shape,
    pod_seconds,
)
from pdserve.bench.autoscale.deployment import Sample, ScaleRow
from pdserve.bench.autoscale.trace import SHIPPED, load_trace, make_trace, parse_trace
from pdserve.bench.disagg.workload import PlannedRequest
from pdserve.loadtest.calls import CallResult
from pdserve.planner.autoscale import Shape

NS = 1_000_000_000


def test_the_fixed_arms_are_every_deployment_of_up_to_four_pods() -> None:
    names = [str(shape) for shape in fixed_shapes()]
    assert sorted(names) == sorted(
        ["0P1D", "0P2D", "0P3D", "0P4D", "1P1D", "1P2D", "1P3D", "2P1D", "2P2D", "3P1D"]
    )
    assert parse_shape("2P1D") == Shape(2, 1)
    assert parse_arms(f"{AUTOSCALE}, 1P2D") == [AUTOSCALE, "1P2D"]
    assert parse_arms(f"{AUTOSCALE_COLOCATED},0P2D") == [AUTOSCALE_COLOCATED, "0P2D"]
    for bad in ("1P0D", "P2D", "1X2", "1P2"):
        with pytest.raises(argparse.ArgumentTypeError, match=bad):
            parse_arms(bad)


def test_the_shipped_trace_is_the_generators_and_shifts_rate_and_mix() -> None:
    assert json.loads(SHIPPED.read_text()) == json.loads(json.dumps(make_trace()))
    phases = load_trace(None)
    assert [p.name for p in phases] == ["chat-low", "long-surge", "chat-high", "quiet"]
    assert sum(p.seconds for p in phases) == 24 * 60
    rates = {p.name: p.rate for p in phases}
    assert rates["chat-high"] > rates["chat-low"] > rates["quiet"]
    long_share = {p.name: next(c.weight for c in p.classes if c.name == "long") for p in phases}
    assert long_share["long-surge"] > 0.5 > long_share["chat-high"]
    short = parse_trace(make_trace(minutes=4))
    assert [p.seconds for p in short] == [60.0] * 4  # phases scaled alike, rates kept
    assert [p.rate for p in short] == [p.rate for p in phases]


def test_a_bad_phase_is_refused_with_its_field_named() -> None:
    trace = make_trace()
    trace["phases"][1]["rate"] = 0
    with pytest.raises(ValueError, match=r"phases\[1\]\.rate"):
        parse_trace(trace)
    trace = make_trace()
    trace["phases"][2]["classes"] = []
    with pytest.raises(ValueError, match=r"phases\[2\]\.classes"):
        parse_trace(trace)


def test_pod_seconds_integrate_the_samples_over_the_window() -> None:
    samples = [
        Sample(0.0, Shape(1, 1), 0),
        Sample(10.0, Shape(1, 3), 0),
        Sample(20.0, Shape(1, 2), 0),
    ]
    assert pod_seconds(samples, 0.0, 30.0) == {"prefill": 30.0, "decode": 10 + 30 + 20}
    assert pod_seconds(samples, 5.0, 15.0) == {"prefill": 10.0, "decode": 5 + 15}


def _result(number: int, ttft_s: float | None, error: str = "") -> CallResult:
    first = None if ttft_s is None else int(ttft_s * NS)
    gaps = () if ttft_s is None else (int(0.1 * NS),) * 9
    tokens = 0 if ttft_s is None else 10
    status = "Unavailable" if error else "OK"
    return CallResult(0.0, NS, status, error, tokens, first, gaps, number)


def test_a_phase_row_counts_its_own_requests_events_and_migrations() -> None:
    trace = parse_trace(make_trace(minutes=4))
    window = Window(trace[1], start=100.0)  # [100, 160)
    plan = tuple(PlannedRequest("chat", (1, 2, 3), 10, 2.0) for _ in range(4))
    results = (_result(0, 0.5), _result(1, 3.0), _result(2, None, "lost"), _result(3, 1.0))
    samples = [
        Sample(90.0, Shape(1, 1), 0),
        Sample(130.0, Shape(1, 2), 1),
        Sample(170.0, Shape(1, 1), 3),
    ]
    scaled = [
        ScaleRow(95.0, {"action": "scale_up"}),  # the phase before
        ScaleRow(129.0, {"action": "scale_up"}),
        ScaleRow(140.0, {"action": "hold"}),
        ScaleRow(159.0, {"action": "scale_down"}),
    ]
    row = _row("autoscale", window, plan, results, samples, scaled, tpot_slo_s=0.3)
    assert (row.attainment, row.goodput) == (0.5, 2 / 60)  # TTFT 3.0 > 2.0 misses; one lost
    assert (row.requests_lost, row.requests) == (1, 4)
    assert row.scale_events == 2 and row.streams_migrated == 1
    assert row.first_scale_down_s == 159.0 - window.start
    assert row.pod_seconds == {"prefill": 60.0, "decode": 30 + 2 * 30}
    summary = _summary("autoscale", [row, row])
    assert summary["pod_seconds_total"] == 2 * 150.0 and summary["requests_lost"] == 2
    assert summary["phases_attained"] == 0


def test_rows_are_the_issues_json_fields() -> None:
    fields = set(PhaseRow.__dataclass_fields__)
    wanted = {"arm", "phase", "attainment", "goodput", "pod_seconds", "scale_events"}
    assert wanted | {"streams_migrated", "requests_lost"} <= fields
