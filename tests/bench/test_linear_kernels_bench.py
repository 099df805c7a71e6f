"""`pdserve bench int8-linear`: a row per row count and model shape, every arm timed."""

from __future__ import annotations

import json
import shutil

import pytest

from pdserve.bench.micro.linear_kernels import model_shapes
from pdserve.cli import main


def test_every_model_shape_at_every_row_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "int8-linear", "--rows", "1,20", "--calls", "1", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    shapes = model_shapes(None)
    # SmolLM2-135M: fused QKV, o_proj, fused gate/up, down, the lm_head
    assert shapes == [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]
    assert [(r["rows"], r["out_features"], r["in_features"]) for r in rows] == [
        (n, *shape) for n in (1, 20) for shape in shapes
    ]
    kernel_arm = ["int8 kernel"] if shutil.which("c++") else []
    for row in rows:
        arms = ["float32 onednn", *kernel_arm] + (["int8 torch"] if row["rows"] <= 16 else [])
        assert set(row) == {"rows", "out_features", "in_features", *arms}
        assert all(row[arm] > 0 for arm in arms)
