"""`pdserve bench spec` end to end on two short requests of the shipped repetition workload
(real model, both modes), and the workload's generator reproduces the shipped file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdserve.bench.offline.spec_workload import WORKLOAD_DIR, requests
from pdserve.cli import main

SHIPPED = WORKLOAD_DIR / "repetition.json"
FIELDS = {"mode", "slots", "tokens_per_s", "ms_per_token_batch1", "acceptance_rate"}


def test_generator_reproduces_the_shipped_workload(tmp_path: Path) -> None:
    out = tmp_path / "repetition.json"
    assert main(["bench", "make-spec-workload", "--out", str(out)]) == 0
    assert out.read_text() == SHIPPED.read_text()
    assert len(json.loads(out.read_text())) == len(requests())


def test_rows_per_mode_and_setting_with_equal_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "two.json"
    shipped = json.loads(SHIPPED.read_text())
    workload.write_text(json.dumps([{**request, "max_tokens": 12} for request in shipped[:2]]))
    argv = ["bench", "spec", "--workload", str(workload), "--slots", "2", "--batch1", "--json"]

    assert main(argv) == 0

    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(row["mode"], row["slots"]) for row in rows] == [
        ("off", 2),
        ("ngram", 2),
        ("off", 1),
        ("ngram", 1),
    ]
    for row in rows:
        assert row.keys() >= FIELDS
        assert row["outputs_match"] is True
        assert 0 < row["output_tokens"] <= 24 and row["tokens_per_s"] > 0
        assert (row["acceptance_rate"] is None) == (row["mode"] == "off")
        assert (row["ms_per_token_batch1"] is None) == (row["slots"] == 2)
        assert 0 <= row["accepted_tokens"] <= row["drafted_tokens"]
        assert (row["drafted_tokens"] == 0) == (row["mode"] == "off")
