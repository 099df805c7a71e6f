"""`pdserve bench linear`: a row per row count and model shape (or per row count with `--step`),
every arm that runs here timed."""

from __future__ import annotations

import json
import shutil

import pytest

from pdserve.bench.micro.linear_kernels import model_shapes, step_shapes
from pdserve.cli import main
from pdserve.kernels import cpu_panel_linear
from pdserve.kernels.cpu_panel_linear import VectorPath


def _arms(rows: int) -> list[str]:
    """The arms that run here: the panel kernel where built, on this CPU's default path and on
    every other vector path it has (AVX2 beside AVX-512, or the reverse on AMD)."""
    kernel_arms = ["float32 panels", "int8 panels"] if shutil.which("c++") else []
    widest, default = cpu_panel_linear.widest_path_here(), cpu_panel_linear.default_path_here()
    if kernel_arms and widest is VectorPath.AVX512:
        other = "avx512" if default is VectorPath.AVX2 else "avx2"
        kernel_arms += [f"float32 panels {other}", f"int8 panels {other}"]
    return ["float32 onednn", *kernel_arms] + (["int8 torch"] if rows <= 16 else [])


def _rows(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    lines = capsys.readouterr().out.splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_every_model_shape_at_every_row_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "linear", "--rows", "1,20", "--calls", "1", "--json"]) == 0
    rows = _rows(capsys)
    shapes = model_shapes(None)
    # SmolLM2-135M: fused QKV, o_proj, fused gate/up, down, the lm_head
    assert shapes == [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]
    assert [(r["rows"], r["out_features"], r["in_features"]) for r in rows] == [
        (n, *shape) for n in (1, 20) for shape in shapes
    ]
    for row in rows:
        arms = _arms(int(str(row["rows"])))
        assert set(row) == {"rows", "out_features", "in_features", *arms}
        assert all(float(str(row[arm])) > 0 for arm in arms)


def test_a_step_runs_every_layer_weight_once_per_arm(capsys: pytest.CaptureFixture[str]) -> None:
    shapes = step_shapes(None)
    assert len(shapes) == 30 * 4 + 1 and shapes[-1] == (49152, 576)
    assert main(["bench", "linear", "--step", "--rows", "2", "--calls", "1", "--json"]) == 0
    (row,) = _rows(capsys)
    assert set(row) == {"rows", *_arms(2)}
    for arm in _arms(2):
        cell = row[arm]
        assert isinstance(cell, dict) and cell["ms"] > 0 and cell["gb_per_s"] > 0
