"""The panel linear kernel (kernels/cpu_panel_linear.cpp) against float64 sums of the same
weights (int8 ones dequantized), on each of its paths and both weight types, and the layer formats
`prepare` picks for it."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve.core.model.gemm import WeightFormat, cpu_float32_backend, linear, prepare
from pdserve.core.model.precision import quantize_int8
from pdserve.kernels import cpu_panel_linear
from pdserve.kernels.cpu_panel_linear import VectorPath
from tests.kernels.built import built_kernel


@pytest.fixture(scope="module")
def module() -> ModuleType:
    return built_kernel(cpu_panel_linear.kernel)


def _check(
    module: ModuleType,
    leading: tuple[int, ...],
    out_features: int,
    in_features: int,
    with_bias: bool,
    path: VectorPath,
    weight_type: torch.dtype,
    seed: int = 0,
) -> None:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator)
    x = torch.randn(*leading, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    if weight_type == torch.int8:
        quantized, scales = quantize_int8(weight)
        packed = cpu_panel_linear.pack(quantized, scales)
        exact = quantized.double() * scales.double()[:, None]
    else:
        packed, exact = cpu_panel_linear.pack(weight), weight.double()
    expected = x.double() @ exact.T + (0 if bias is None else bias.double())
    out = module.panel_linear(x, packed.panels, packed.scales, bias, packed.out_features, path)
    assert out.shape == (*leading, out_features) and out.dtype == torch.float32
    largest_input = float(x.abs().sum(-1).max()) if x.numel() else 0.0
    tolerance = 1e-5 * (1 + largest_input * float(exact.abs().max()))
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=tolerance)


WEIGHT_TYPES = [torch.int8, torch.float32]


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("path", list(VectorPath))
@pytest.mark.parametrize(
    ("out_features", "in_features"),
    [(576, 576), (1536, 576), (576, 1536), (100, 37), (16, 1), (17, 5)],
)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 23, 64])
def test_matches_the_exact_sums(
    module: ModuleType,
    rows: int,
    out_features: int,
    in_features: int,
    path: VectorPath,
    weight_type: torch.dtype,
) -> None:
    """Every tile height of both vector paths and its remainders (a path wider than this CPU has
    runs its widest); a part-filled last panel, an odd one left out of AVX-512's pairs; k not a
    multiple of the chains; the model's shapes (the prefetch reaches past a panel's end: past
    the last one too)."""
    _check(module, (rows,), out_features, in_features, rows % 2 == 1, path, weight_type)


@settings(max_examples=40, deadline=None)
@given(
    leading=st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple),
    out_features=st.integers(1, 70),
    in_features=st.integers(1, 70),
    with_bias=st.booleans(),
    path=st.sampled_from(list(VectorPath)),
    weight_type=st.sampled_from(WEIGHT_TYPES),
    seed=st.integers(0, 1000),
)
def test_any_shape(
    module: ModuleType,
    leading: tuple[int, ...],
    out_features: int,
    in_features: int,
    with_bias: bool,
    path: VectorPath,
    weight_type: torch.dtype,
    seed: int,
) -> None:
    _check(module, leading, out_features, in_features, with_bias, path, weight_type, seed)


def test_arguments_that_do_not_fit_are_refused_naming_them(module: ModuleType) -> None:
    weight = torch.randn(32, 8)
    int8 = cpu_panel_linear.pack(*quantize_int8(weight))
    float32 = cpu_panel_linear.pack(weight)
    x = torch.ones(2, 8)
    with pytest.raises(RuntimeError, match="x: float32"):
        module.panel_linear(x.double(), int8.panels, int8.scales, None, 32)
    with pytest.raises(RuntimeError, match="x: last dimension"):
        module.panel_linear(torch.ones(2, 9), int8.panels, int8.scales, None, 32)
    with pytest.raises(RuntimeError, match="out_features"):
        module.panel_linear(x, int8.panels, int8.scales, None, 33)
    with pytest.raises(RuntimeError, match="bias"):
        module.panel_linear(x, int8.panels, int8.scales, torch.ones(31), 32)
    with pytest.raises(RuntimeError, match="scales"):
        module.panel_linear(x, int8.panels, None, None, 32)
    with pytest.raises(RuntimeError, match="scales"):
        module.panel_linear(x, float32.panels, int8.scales, None, 32)
    with pytest.raises(RuntimeError, match="panels: contiguous int8 or float32"):
        module.panel_linear(x, float32.panels.double(), None, None, 32)


def test_float32_activations_run_the_kernel(module: ModuleType) -> None:
    assert prepare(torch.randn(40, 24), None, "int8").format is WeightFormat.INT8_PANELS
    assert prepare(torch.randn(40, 24)).format is WeightFormat.FLOAT32_PANELS
    assert prepare(torch.randn(40, 24).bfloat16(), None, "int8").format is WeightFormat.INT8_ROWS
    assert prepare(torch.randn(40, 24).bfloat16()).format is WeightFormat.FLOAT
    assert cpu_float32_backend().startswith("panels-")


@pytest.mark.usefixtures("cpu_kernels_off")
@pytest.mark.parametrize("quantization", ["int8", "none"])
def test_switched_off_torch_runs_the_same_layer(module: ModuleType, quantization: str) -> None:
    weight, bias, x = torch.randn(40, 24), torch.randn(40), torch.randn(5, 24)
    plain = prepare(weight, bias, quantization)
    assert plain.format is (
        WeightFormat.INT8_ROWS if quantization == "int8" else WeightFormat.FLOAT
    )
    assert not cpu_float32_backend().startswith("panels")
    packed = (
        cpu_panel_linear.pack(*quantize_int8(weight))
        if quantization == "int8"
        else cpu_panel_linear.pack(weight)
    )
    in_panels = module.panel_linear(x, packed.panels, packed.scales, bias, 40)
    torch.testing.assert_close(in_panels, linear(x, plain), rtol=1e-5, atol=1e-5)


def test_a_cpu_without_the_vector_path_keeps_onednn_for_float32(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    assert cpu_panel_linear.vectorized_here() is avx2
    monkeypatch.setattr(cpu_panel_linear, "vectorized_here", lambda: False)
    assert prepare(torch.randn(40, 24)).format is WeightFormat.FLOAT
    assert prepare(torch.randn(40, 24), None, "int8").format is WeightFormat.INT8_PANELS
    assert not cpu_float32_backend().startswith("panels")


def test_the_default_path_is_the_widest_but_avx2_on_amd(module: ModuleType) -> None:
    widest = cpu_panel_linear.widest_path_here()
    assert widest is VectorPath(module.widest_path_here())
    amd = "AuthenticAMD" in Path("/proc/cpuinfo").read_text()
    expected = min(widest, VectorPath.AVX2) if amd else widest
    assert cpu_panel_linear.default_path_here() is expected
