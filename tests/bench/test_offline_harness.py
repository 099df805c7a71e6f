"""`pdserve bench offline` end to end on a tiny workload, with the real model and engines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdserve.cli import main

# Different prompt lengths and max_tokens in one hf batch of 2: padding, and counting only each
# request's own max_tokens although the batch runs to the largest.
TINY = [
    {"prompt": [400, 500, 600, 700, 800], "max_tokens": 3},
    {"prompt": [1000, 1100, 1200], "max_tokens": 6},
    {"prompt": [1300, 1400, 1500, 1600], "max_tokens": 4},
]
FIELDS = {"engine", "max_batch", "output_tokens", "seconds", "tokens_per_s"}


@pytest.fixture
def tiny_workload(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def test_json_lines_have_the_fields_and_the_plot_is_a_png(
    tiny_workload: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "plot.png"
    argv = ["bench", "offline", "--workload", str(tiny_workload), "--engine", "continuous,static"]
    argv += ["--engine", "hf", "--max-batch", "2", "--json", "--compare", "--plot", str(plot)]

    assert main(argv) == 0

    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert [r["engine"] for r in records] == ["continuous", "static", "hf"]
    for record in records:
        assert record.keys() >= FIELDS
        assert record["max_batch"] == 2
        assert record["output_tokens"] == 3 + 6 + 4
        assert record["seconds"] > 0
        assert record["tokens_per_s"] == pytest.approx(13 / record["seconds"], rel=1e-2)
    assert "continuous/static" in captured.err and "static/hf" in captured.err
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_engine_is_refused_by_name(
    tiny_workload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "offline", "--workload", str(tiny_workload), "--engine", "vllm"])
    assert "--engine" in capsys.readouterr().err


def test_bad_workload_file_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"prompt": [1, 2], "max_tokens": -1}]))
    assert main(["bench", "offline", "--workload", str(bad)]) == 2
    assert "max_tokens" in capsys.readouterr().err
