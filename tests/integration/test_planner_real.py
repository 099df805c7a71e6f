"""The planner's real-process doors: serving calibration, a-priori validation and plan
verification each start a real cluster here and print what they promise."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pdserve.costmodel.profile import load_profile
from tests.fakes import PROFILE_OTHER_HOST

pytestmark = pytest.mark.integration

SMALL = {
    "rate": 2,
    "duration_s": 10,
    "prompt_tokens": {"min": 10, "max": 30},
    "output_tokens": {"min": 4, "max": 8},
    "seed": 5,
}


def _pdserve(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pdserve", *args], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_serving_calibration_adds_costs_to_a_profile(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    bursts = ["--bursts", "4,1"]  # two sizes fit the line; the default five take twice as long
    logs = set(Path(tempfile.gettempdir()).glob("pdserve-serving-*"))
    _pdserve("profile", "--serving", *bursts, "--from", str(PROFILE_OTHER_HOST), "--out", str(out))
    assert set(Path(tempfile.gettempdir()).glob("pdserve-serving-*")) <= logs  # logs removed
    serving = load_profile(out).serving
    assert serving.calibration["bursts"] == [1, 4]
    assert min(serving.per_step_s, serving.per_token_s, serving.dispatch_s) >= 0
    assert (
        load_profile(out).model == load_profile(PROFILE_OTHER_HOST).model
    )  # the offline fit is kept


def test_validation_prints_a_line_per_metric_and_a_verdict(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SMALL))
    flags = ["--configs", "1P1D", "--rates", "2", "--traffic-s", "2", "--repeats", "2"]
    text = _pdserve(
        "simulate",
        "--validate",
        "--profile",
        str(PROFILE_OTHER_HOST),
        "--workload",
        str(spec),
        *flags,
        "--json",
    )
    *lines, verdict = _json_lines(text)
    metrics = [line["metric"] for line in lines]
    assert metrics == ["ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "attainment"]
    for line in lines:
        assert line["config"] == "1P1D" and line["repeats"] == 2 and line["real"] > 0
        assert line["real_ci"][0] <= line["real"] <= line["real_ci"][1]
        assert line["noise"] is not None and line["noise"] >= 0  # two repeats: their spread
    assert verdict["latency_errors"] == 4 and verdict["median_noise"] is not None
    assert isinstance(verdict["meets_target"], bool)


def test_plan_verify_runs_the_plan_and_reports_both_sides(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**SMALL, "duration_s": 5}))  # 5 requests at 1 req/s
    slos = ["--slo-ttft-p90", "30", "--slo-itl-p99", "5"]
    values = tmp_path / "values.yaml"
    text = _pdserve(
        "plan",
        "--profile",
        str(PROFILE_OTHER_HOST),
        "--workload",
        str(spec),
        "--rate",
        "1",
        *slos,
        "--max-workers",
        "2",
        "--out",
        str(values),
        "--verify",
        "--json",
    )
    (result,) = _json_lines(text)
    assert result["plan"] in {"0P1D", "0P2D", "1P1D"}
    assert result["completed"] == result["requests"] > 0
    assert result["meets_slo_predicted"] and result["meets_slo_real"]  # SLOs anyone meets
    assert result["predicted_attainment"] == result["real_attainment"] == 1.0
