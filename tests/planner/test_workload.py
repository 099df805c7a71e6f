"""Workload SPECs: both forms parse, the same SPEC gives the same requests, and bad input names
its field (also through `pdserve simulate`, which exits 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdserve.cli import main
from pdserve.planner.workload import (
    PoissonSpec,
    TokenRange,
    TraceRequest,
    WorkloadSpecError,
    parse_spec,
    requests_of,
)
from tests.planner.helpers import fixed_step_profile

POISSON = {
    "rate": 5.0,
    "duration_s": 200,
    "prompt_tokens": {"min": 10, "max": 100},
    "output_tokens": {"min": 20, "max": 200},
}


def test_trace_lines_parse_in_arrival_order() -> None:
    text = (
        '{"arrival_s": 0.5, "prompt_tokens": 8, "output_tokens": 2}\n\n'
        '{"arrival_s": 0.12, "prompt_tokens": 87, "output_tokens": 140}\n'
    )
    assert parse_spec(text, "t") == (TraceRequest(0.12, 87, 140), TraceRequest(0.5, 8, 2))


def test_trace_lines_may_share_a_prefix() -> None:
    text = (
        '{"arrival_s": 0, "prompt_tokens": 87, "output_tokens": 4, "prefix_id": 3, '
        '"prefix_tokens": 64}\n'
        '{"arrival_s": 1, "prompt_tokens": 8, "output_tokens": 2}\n'
    )
    assert parse_spec(text, "t") == (TraceRequest(0.0, 87, 4, 3, 64), TraceRequest(1.0, 8, 2))


def test_a_poisson_shared_prefix_keeps_the_lengths_and_groups_the_prompts() -> None:
    """The same SPEC with `shared_prefix` draws the same arrivals and lengths; each request joins
    one of the groups, sharing up to `tokens` (all of a shorter prompt)."""
    plain = requests_of(parse_spec(json.dumps(POISSON), "p"))
    spec = {**POISSON, "shared_prefix": {"groups": 3, "tokens": 32}}
    shared = requests_of(parse_spec(json.dumps(spec), "p"))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in shared] == [
        (r.arrival_s, r.prompt_tokens, r.output_tokens) for r in plain
    ]
    assert {r.prefix_id for r in shared} == {0, 1, 2}
    assert all(r.prefix_tokens == min(32, r.prompt_tokens) for r in shared)
    assert all(r.prefix_id is None and r.prefix_tokens == 0 for r in plain)


def test_poisson_spec_is_seeded_and_within_its_ranges() -> None:
    spec = parse_spec(json.dumps(POISSON), "p")
    assert isinstance(spec, PoissonSpec)
    requests = requests_of(spec)
    assert requests == requests_of(parse_spec(json.dumps(POISSON), "p"))
    assert len(requests) == pytest.approx(5.0 * 200, rel=0.1)
    assert all(10 <= r.prompt_tokens <= 100 and 20 <= r.output_tokens <= 200 for r in requests)
    assert all(0 < r.arrival_s < 200 for r in requests)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"arrival_s": -1, "prompt_tokens": 8, "output_tokens": 2}', "arrival_s"),
        ('{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 2}', "prompt_tokens"),
        ('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": true}', "output_tokens"),
        ("[1, 2]", "line 1"),
        (json.dumps({**POISSON, "rate": 0}), "rate"),
        (json.dumps({**POISSON, "prompt_tokens": {"min": 9, "max": 2}}), "prompt_tokens"),
        (json.dumps({**POISSON, "burst": 1}), "burst"),
        ('{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2, "prefix": 1}', "prefix"),
        (
            '{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2, "prefix_id": 1}',
            "prefix_tokens",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2, "prefix_tokens": 4}',
            "prefix_id",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2, "prefix_id": -1, '
            '"prefix_tokens": 4}',
            "prefix_id",
        ),
        (
            '{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2, "prefix_id": 0, '
            '"prefix_tokens": 9}',
            "prefix_tokens",
        ),
        (json.dumps({**POISSON, "shared_prefix": {"groups": 0, "tokens": 8}}), "shared_prefix"),
        (json.dumps({**POISSON, "shared_prefix": {"tokens": 8}}), "shared_prefix"),
    ],
)
def test_bad_specs_name_the_field(text: str, field: str) -> None:
    with pytest.raises(WorkloadSpecError, match=field):
        parse_spec(text, "spec")


def test_simulate_cli_refuses_a_bad_spec_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    fixed_step_profile(0.01).save(profile)
    workload = tmp_path / "bad.json"
    workload.write_text(json.dumps({**POISSON, "duration_s": -3}))
    argv = ["simulate", "--profile", str(profile), "--workload", str(workload)]
    assert main(argv) == 2
    assert "duration_s" in capsys.readouterr().err


def test_simulate_cli_prints_one_json_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    fixed_step_profile(0.01).save(profile)
    workload = tmp_path / "trace.jsonl"
    workload.write_text('{"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 3}\n')
    argv = [
        "simulate",
        "--profile",
        str(profile),
        "--workload",
        str(workload),
        "--prefill",
        "0",
        "--decode",
        "1",
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["config"] == "0P1D" and summary["completed"] == 1
    assert summary["ttft_p50"] == pytest.approx(0.01) and summary["itl_p50"] == pytest.approx(0.01)


def test_plan_rescales_a_trace_to_the_target_rate() -> None:
    from pdserve.planner.plan_cli import at_rate

    trace = tuple(TraceRequest(float(i), 10, 5) for i in range(11))  # 1 request/s
    rescaled = at_rate(trace, 4.0)
    assert [r.arrival_s for r in rescaled] == pytest.approx([i / 4 for i in range(11)])
    assert at_rate(parse_spec(json.dumps(POISSON), "p"), 2.0) == requests_of(
        PoissonSpec(2.0, 200, *_ranges())
    )


def _ranges() -> tuple[TokenRange, TokenRange]:
    return TokenRange(10, 100), TokenRange(20, 200)
