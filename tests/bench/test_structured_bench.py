"""`pdserve bench structured` end to end on two short requests of the shipped workload (real
model, both modes), and the workload's generator reproduces the shipped file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdserve.bench.offline.structured_workload import WORKLOAD_DIR, questions
from pdserve.cli import main

SHIPPED = WORKLOAD_DIR / "structured.json"


def test_generator_reproduces_the_shipped_workload(tmp_path: Path) -> None:
    out = tmp_path / "structured.json"
    assert main(["bench", "make-structured-workload", "--out", str(out)]) == 0
    assert out.read_text() == SHIPPED.read_text()
    assert len(json.loads(out.read_text())) == len(questions())


def test_both_modes_run_the_same_tokens_and_every_output_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "two.json"
    shipped = json.loads(SHIPPED.read_text())
    workload.write_text(json.dumps([{**request, "max_tokens": 12} for request in shipped[:2]]))
    argv = ["bench", "structured", "--workload", str(workload), "--slots", "2"]

    assert main([*argv, "--repeats", "1", "--batch1", "--json"]) == 0

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    rows = [line for line in lines if "mode" in line]
    assert [(row["mode"], row["slots"]) for row in rows] == [
        ("off", 2),
        ("json_schema", 2),
        ("off", 1),
        ("json_schema", 1),
    ]
    for row in rows:
        assert row["output_tokens"] == rows[1]["output_tokens"] > 0  # the same work in each
        assert row["tokens_per_s"] > 0 and row["steps"] > 0
        assert (row["ms_per_token_batch1"] is None) == (row["slots"] == 2)
        constrained = row["mode"] == "json_schema"
        assert (row["mask_ms_per_step"] > 0) == constrained
        if constrained:  # 12 tokens: too few for a whole record, none may break its schema
            assert row["invalid"] == 0 and row["valid"] + row["truncated"] == 2
    (summary,) = [line for line in lines if "summary" in line]
    assert summary["slots"] == 2 and len(summary["ratios"]) == 1
