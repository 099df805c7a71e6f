"""`pdserve loadtest` end to end through the CLI table: report file, PNG plots, sweep, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdserve.cli import main

from .conftest import FakeServer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _config_file(tmp_path: Path, server: FakeServer, **keys: object) -> Path:
    path = tmp_path / "config.json"
    raw = {"call": "pdserve.v1.Generation.GenerateStream", "host": "127.0.0.1:1", "insecure": True}
    path.write_text(json.dumps({**raw, "data": {"prompt": "ok"}, **keys}))
    return path


def test_single_run_writes_report_and_plot(
    fake_server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config_file(tmp_path, fake_server, total=12, concurrency=3)
    output, plot = tmp_path / "report.json", tmp_path / "latency.png"
    argv = ["loadtest", str(config), "--host", fake_server.target, "-o", str(output)]
    assert main([*argv, "--plot", str(plot), "--ttft-target-ms", "1000"]) == 0

    report = json.loads(output.read_text())
    assert report["count"] == 12 and report["statusCodeDistribution"] == {"OK": 12}
    assert report["options"]["host"] == fake_server.target  # the --host override won
    assert report["generation"]["goodput"]["ttftTarget"] == 1_000_000_000
    assert plot.read_bytes().startswith(PNG_MAGIC)
    assert "12 done" in capsys.readouterr().err  # progress went to stderr


def test_sweep_runs_each_rate_and_plots_latency_against_load(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    config = _config_file(tmp_path, fake_server, total=6, concurrency=6)
    output, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    argv = ["loadtest", str(config), "--host", fake_server.target, "--sweep", "20,60", "-q"]
    assert main([*argv, "-o", str(output), "--plot", str(plot)]) == 0

    sweep = json.loads(output.read_text())["sweep"]
    assert [point["offeredRps"] for point in sweep] == [20.0, 60.0]
    assert [point["report"]["options"]["rps"] for point in sweep] == [20.0, 60.0]
    assert all(point["report"]["count"] == 6 for point in sweep)
    # 6 calls at 20 rps span >= 5 / 20 s; at 60 rps the same calls finish sooner.
    assert sweep[0]["report"]["total"] >= 0.25e9 > sweep[1]["report"]["total"]
    assert plot.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sweep", "4,2"], "--sweep: rates must increase"),
        (["--itl-target-ms", "0"], "--itl-target-ms: must be > 0"),
        (["-z", "soon"], "duration: not a Go duration"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"call": "pdserve.v1.Generation.Generate", "host": "h:1"}))
    assert main(["loadtest", str(config), *extra]) == 2
    assert message in capsys.readouterr().err
