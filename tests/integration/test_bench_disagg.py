"""`pdserve bench disagg` through real processes: fresh prompts find nothing cached; a SPEC that
asks for shared prefixes gets hits; every planned request is counted and placed as its arm says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def _spec(shared_prefix: dict[str, int] | None) -> dict[str, Any]:
    chat: dict[str, Any] = {
        "name": "chat",
        "prompt_tokens": {"min": 40, "max": 64},
        "output_tokens": {"min": 4, "max": 8},
        "ttft_slo": {"seconds": 60.0},
    }
    if shared_prefix is not None:
        chat["shared_prefix"] = shared_prefix
    return {"classes": [chat]}


def _bench(
    tmp_path: Path, arm: str, spec: dict[str, Any], rates: str = "1,2"
) -> list[dict[str, Any]]:
    """One repeat, on one cluster: repeats start fresh clusters, which cannot hit each other's
    caches (tests/bench/test_disagg_plan.py checks how repeats pool)."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    command = [sys.executable, "-m", "pdserve", "bench", "disagg", "--arms", arm, "--json"]
    command += ["--rates", rates, "--duration", "2", "--repeats", "1", "--max-repeats", "1"]
    command += ["--slo-tpot", "10"]
    command += ["--workload", str(spec_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_fresh_prompts_are_never_cache_hits_and_all_go_remote(tmp_path: Path) -> None:
    rows = _bench(tmp_path, "disaggregated", _spec(None))  # both rates on one cluster
    points, (summary,) = rows[:-1], rows[-1:]
    assert [(row["rate"], row["requests"]) for row in points] == [(1.0, 2), (2.0, 4)]  # 2 s each
    for row in points:
        assert row["completed"] == row["requests"]
        assert row["repeats"] == 1
        assert row["placements"] == {"local": 0, "remote": row["requests"]}
        assert row["prefix_hit_tokens"] == 0  # no replay across rates
        assert row["attainment"] == 1.0  # the SLOs are loose: every completed request meets them
        low, high = row["attainment_ci"]
        assert low <= row["attainment"] <= high
    # One repeat has no spread to rank the arms by: every rate is reported so.
    assert summary == {"arm": "disaggregated", "goodput_rate": 2.0, "wide_intervals": [1.0, 2.0]}


def test_a_shared_prefix_spec_reports_its_hits(tmp_path: Path) -> None:
    rows = _bench(tmp_path, "colocated", _spec({"groups": 1, "tokens": 32}), "2")  # one point
    assert len(rows) == 2  # the point and the summary
    for row in rows[:-1]:
        assert row["placements"] == {"local": row["requests"], "remote": 0}
        assert row["prefix_hit_tokens"] > 0
