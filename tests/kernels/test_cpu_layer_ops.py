"""The layer ops kernel (kernels/cpu_layer_ops.cpp) against the torch ops it replaces, in float64:
decode rows, prefill rows (split over threads), strided rows as the model passes them."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve.kernels import layer_ops
from tests.kernels.built import built_kernel

EPS = 1e-5
ROWS = [1, 3, 16, 700]  # one decode row, a few, a decode batch, a prefill split over threads


@pytest.fixture(scope="module")
def module() -> ModuleType:
    return built_kernel(layer_ops.kernel)


def _close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tolerance, atol=tolerance)


def _reference_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("width", [576, 7])
def test_add_rms_norm_sums_in_place_and_normalizes(
    module: ModuleType, rows: int, width: int
) -> None:
    hidden, residual = torch.randn(rows, width), torch.randn(rows, width)
    weight = torch.rand(width) + 0.5
    expected_sum = hidden.double() + residual.double()
    normed, total = layer_ops.add_rms_norm(hidden, residual, weight, EPS)
    assert total.data_ptr() == residual.data_ptr()  # the residual stream, updated in place
    _close(total.double(), expected_sum, 1e-6)
    torch.testing.assert_close(
        normed.double(), _reference_norm(total, weight), rtol=1e-5, atol=1e-5
    )


def test_add_rms_norm_without_a_residual_normalizes_hidden(module: ModuleType) -> None:
    hidden, weight = torch.randn(4, 576), torch.rand(576)
    original = hidden.clone()
    normed, total = layer_ops.add_rms_norm(hidden, None, weight, EPS)
    assert total.data_ptr() == hidden.data_ptr() and torch.equal(hidden, original)
    torch.testing.assert_close(
        normed.double(), _reference_norm(hidden, weight), rtol=1e-5, atol=1e-5
    )


def _torch_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x64 = x.double()
    rotated = torch.cat((-x64[..., half:], x64[..., :half]), dim=-1)
    return x64 * cos.double().unsqueeze(1) + rotated * sin.double().unsqueeze(1)


@pytest.mark.parametrize("rows", ROWS)
def test_rotary_rotates_q_and_k_heads_in_place_inside_qkv(module: ModuleType, rows: int) -> None:
    """As the model calls it: q and k heads, a view into the fused QKV rows (v left alone)."""
    heads, kv_heads, dim = 9, 3, 64
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim)
    qk = qkv[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, dim)
    v_before = qkv[:, (heads + kv_heads) * dim :].clone()
    angles = torch.rand(rows, dim) * 6
    cos, sin = angles.cos(), angles.sin()
    expected = _torch_rotary(qk, cos, sin)
    out = layer_ops.apply_rotary(qk, cos, sin)
    assert out.data_ptr() == qk.data_ptr()
    _close(out.double(), expected, 1e-6)
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], v_before)


@pytest.mark.parametrize("rows", ROWS)
def test_silu_and_mul(module: ModuleType, rows: int) -> None:
    gate_up = torch.randn(rows, 2 * 1536) * 4
    gate, up = gate_up.double().chunk(2, dim=-1)
    expected = F.silu(gate) * up
    torch.testing.assert_close(
        layer_ops.silu_and_mul(gate_up).double(), expected, rtol=1e-5, atol=1e-5
    )


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(0, 40), half=st.integers(1, 40), seed=st.integers(0, 1000))
def test_any_shape_matches_torch(module: ModuleType, rows: int, half: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    width = 2 * half
    hidden, residual = (
        torch.randn(rows, width, generator=generator),
        torch.randn(rows, width, generator=generator),
    )
    weight = torch.rand(width, generator=generator)
    expected_norm = _reference_norm(hidden.double() + residual.double(), weight)
    normed, _ = layer_ops.add_rms_norm(hidden, residual, weight, EPS)
    _close(normed.double(), expected_norm, 1e-5)
    gate, up = hidden.double().chunk(2, dim=-1)
    torch.testing.assert_close(
        layer_ops.silu_and_mul(hidden).double(), F.silu(gate) * up, rtol=1e-5, atol=1e-5
    )
    x = torch.randn(rows, 2, width, generator=generator)
    angles = torch.rand(rows, width, generator=generator) * 6
    expected_rotary = _torch_rotary(x, angles.cos(), angles.sin())
    rotated = layer_ops.apply_rotary(x, angles.cos(), angles.sin())
    _close(rotated.double(), expected_rotary, 1e-6)


def test_arguments_that_do_not_fit_are_refused_naming_them(module: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="residual: must have hidden's shape"):
        module.add_rms_norm(torch.ones(2, 8), torch.ones(3, 8), torch.ones(8), EPS)
    with pytest.raises(RuntimeError, match="weight"):
        module.add_rms_norm(torch.ones(2, 8), None, torch.ones(7), EPS)
    with pytest.raises(RuntimeError, match="cos, sin"):
        module.rotary_in_place(torch.ones(2, 3, 8), torch.ones(2, 4), torch.ones(2, 8))
    with pytest.raises(RuntimeError, match="gate_up: width must be even"):
        module.silu_and_mul(torch.ones(2, 7))


@pytest.mark.usefixtures("cpu_kernels_off")
def test_switched_off_torch_runs_the_same_ops() -> None:
    hidden, residual, weight = torch.randn(5, 16), torch.randn(5, 16), torch.rand(16)
    keep = residual.clone()
    normed, total = layer_ops.add_rms_norm(hidden, residual, weight, EPS)
    assert torch.equal(residual, keep)  # torch's path allocates the sum
    torch.testing.assert_close(
        normed.double(), _reference_norm(total, weight), rtol=1e-5, atol=1e-5
    )
    assert layer_ops.kernel() is None
