"""`pdserve selftest --gpu` on a machine without CUDA: arguments, skips, and the JSON report.
(Its GPU run is the script's job, not the suite's: docs/kernels.md.)"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from pdserve.selftest import cli as gpu_selftest
from pdserve.selftest.gpu_checks import CheckStatus, run_check


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    gpu_selftest.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_arguments() -> None:
    args = _parse("--gpu", "--report", "out/r.json", "--skip", "up")
    assert args.gpu and args.report == Path("out/r.json") and args.skip == ["up"]
    with pytest.raises(SystemExit):
        _parse("--report", "r.json")  # --gpu is the point of the command
    with pytest.raises(SystemExit):
        _parse("--gpu", "--skip", "nonsense")


def test_without_cuda_every_check_is_skipped_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report_path = tmp_path / "nested" / "gpu_check.json"
    args = _parse("--gpu", "--report", str(report_path), "--skip", "decode_graphs")
    assert gpu_selftest.run(args) == 0
    report = json.loads(report_path.read_text())
    assert report["cuda_available"] is False and report["passed"] is True
    names = [check["name"] for check in report["checks"]]
    assert names == ["gpu_tests", "greedy_cuda_matches_hf", "attention_bandwidth", "up"]
    assert {check["status"] for check in report["checks"]} == {"skipped"}
    assert report["checks"][0]["details"] == {"reason": "no CUDA device"}


def test_a_raising_check_is_a_failure_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def broken() -> tuple[bool, dict[str, object]]:
        raise RuntimeError("no kernel image")

    result = run_check("attention_bandwidth", broken)
    assert result.status is CheckStatus.FAILED
    assert "no kernel image" in result.details["error"]


def test_failed_checks_make_the_exit_status_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "stand-in GPU")
    monkeypatch.setattr(
        gpu_selftest.gpu_checks, "attention_bandwidth", lambda: (False, {"fraction_of_copy": 0.1})
    )
    only = [n for n in gpu_selftest.CHECK_NAMES if n != "attention_bandwidth"]
    args = _parse("--gpu", "--report", str(tmp_path / "r.json"), *[f"--skip={n}" for n in only])
    assert gpu_selftest.run(args) == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] is False and report["checks"][0]["status"] == "failed"
