"""Opt-in precisions: int8 weight-only GEMM against float32, and refusals with clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pdserve.core.config import EngineConfig
from pdserve.core.model.gemm import linear, prepare
from pdserve.core.model.precision import (
    UnsupportedPrecisionError,
    check_supported,
    quantize_int8,
)


def test_int8_scales_are_per_output_channel() -> None:
    weight = torch.randn(8, 32) * torch.arange(1, 9).unsqueeze(1)
    quantized, scales = quantize_int8(weight)
    assert quantized.dtype == torch.int8 and scales.shape == (8,)
    assert int(quantized.abs().amax(dim=1).min()) == 127  # every row uses its whole range
    dequantized = quantized.float() * scales[:, None]
    assert bool(((dequantized - weight).abs() <= scales[:, None] / 2 + 1e-6).all())


@pytest.mark.parametrize("rows", [1, 5, 16, 40])
def test_int8_linear_is_close_to_float32(rows: int) -> None:
    weight, bias, x = torch.randn(96, 64), torch.randn(96), torch.randn(rows, 64)
    expected = F.linear(x, weight, bias)
    out = linear(x, prepare(weight, bias, "int8"))
    assert out.shape == expected.shape
    assert float((out - expected).abs().max()) < 0.05 * float(expected.abs().max())


def test_unknown_quantization_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="int4")
    with pytest.raises(UnsupportedPrecisionError, match="quantization"):
        check_supported(torch.float32, "fp8", torch.device("cpu"))


def test_int8_is_refused_off_the_cpu() -> None:
    with pytest.raises(UnsupportedPrecisionError, match="CPU only"):
        check_supported(torch.float32, "int8", torch.device("cuda"))


def test_a_dtype_this_cpu_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU without native bf16 (stand-in: oneDNN reporting no support), bfloat16 is refused."""
    check_supported(torch.float32, "none", torch.device("cpu"))
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with pytest.raises(UnsupportedPrecisionError, match=r"dtype: torch\.bfloat16"):
        check_supported(torch.bfloat16, "none", torch.device("cpu"))
