"""core/model/gemm.py: both CPU float32 paths (the panel kernel, oneDNN) compute what `F.linear`
computes, at every row count a step can have and for the input layouts the model passes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pdserve.core.model import gemm
from pdserve.kernels import cpu_panel_linear


@pytest.fixture(params=["panels", "onednn"])
def float32_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "panels" and cpu_panel_linear.kernel() is None:
        pytest.skip("the panel kernel is not built here")
    monkeypatch.setattr(gemm, "FLOAT32_PANELS", request.param == "panels")
    return str(request.param)


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 16, 17, 64, 512])
def test_float32_linear_matches_f_linear(float32_path: str, rows: int) -> None:
    torch.manual_seed(rows)
    weight, bias = torch.randn(96, 48), torch.randn(96)
    x = torch.randn(rows, 48)
    out = gemm.linear(x, gemm.prepare(weight, bias))
    assert out.shape == (rows, 96)
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_non_contiguous_and_batched_inputs(float32_path: str) -> None:
    weight = torch.randn(32, 16)
    layer = gemm.prepare(weight)
    strided = torch.randn(10, 16)[::2]
    transposed = torch.randn(16, 5).t()
    batched = torch.randn(2, 3, 16)
    for x in (strided, transposed, batched):
        torch.testing.assert_close(gemm.linear(x, layer), F.linear(x, weight))


def test_each_path_names_itself_for_host_profiles(float32_path: str) -> None:
    layer = gemm.prepare(torch.randn(40, 24))
    if float32_path == "panels":
        assert layer.format is gemm.WeightFormat.FLOAT32_PANELS
        assert layer.features == (40, 24)
        assert gemm.cpu_float32_backend().startswith("panels-")
    else:
        assert layer.format is gemm.WeightFormat.FLOAT
        assert gemm.cpu_float32_backend().startswith("onednn") is gemm.ONEDNN_ON_CPU


def test_the_onednn_path_is_taken_when_torch_has_it() -> None:
    x, weight = torch.randn(2, 8), torch.randn(4, 8)
    assert gemm._runs_on_onednn(x, weight) is gemm.ONEDNN_ON_CPU
    assert not gemm._runs_on_onednn(x.bfloat16(), weight.bfloat16())


def test_float32_weights_are_packed_once_and_keep_their_size(float32_path: str) -> None:
    weight = torch.randn(48, 24)  # whole panels: no padding
    layer = gemm.prepare(weight)
    assert layer.weight.is_mkldnn is (float32_path == "onednn" and gemm.ONEDNN_ON_CPU)
    assert gemm.weight_bytes(layer) == weight.nbytes
    assert gemm.prepare(weight.bfloat16()).format is gemm.WeightFormat.FLOAT
