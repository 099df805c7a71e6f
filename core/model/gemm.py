"""The model's matmuls, tuned for the small batches of CPU decode steps.

MKL takes a slow path for 3..15 rows (the default model's gate/up projection: 677 us at 15 rows,
376 us at 16; its lm_head 19.7 ms vs 8.4 ms), so such inputs are padded to 16 rows and the extra
rows dropped. For float32 CPU weights, MKL's packed GEMM with each weight reordered once for
exactly 16 rows is faster again (gate/up 280 us, lm_head 6.3 ms; an engine step of 13 sequences
151 -> 110 ms measured side by side) and gives the same bits as `F.linear`. The price is one packed
copy of every weight (+0.5 GB resident for SmolLM2-135M). Other devices and dtypes use `F.linear`.
Int8 weight-only layers (`quantization="int8"`, see precision.py) run `_weight_int8pack_mm`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pdserve.core.model.precision import quantize_int8

PACKED_ROWS = 16


@dataclass(frozen=True)
class LinearWeight:
    weight: torch.Tensor  # [out_features, in_features]; int8 when `scales` is set
    bias: torch.Tensor | None
    packed: torch.Tensor | None  # the weight reordered by MKL for PACKED_ROWS-row inputs
    scales: torch.Tensor | None = None  # [out_features] int8 dequantization scales


def prepare(
    weight: torch.Tensor, bias: torch.Tensor | None = None, quantization: str = "none"
) -> LinearWeight:
    if quantization == "int8":
        quantized, scales = quantize_int8(weight)
        return LinearWeight(quantized, bias, None, scales)
    return LinearWeight(weight, bias, _pack(weight))


def linear(x: torch.Tensor, layer: LinearWeight) -> torch.Tensor:
    """`F.linear(x, layer.weight, layer.bias)`, faster for 3..16 rows on the CPU."""
    if layer.scales is not None:
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x, layer.weight, layer.scales)
        return out if layer.bias is None else out + layer.bias
    rows = x.shape[0]
    if x.device.type != "cpu" or not 2 < rows <= PACKED_ROWS:
        return F.linear(x, layer.weight, layer.bias)
    if rows < PACKED_ROWS:
        padded = x.new_zeros((PACKED_ROWS, x.shape[1]))
        padded[:rows] = x
        x = padded
    if layer.packed is None:
        return F.linear(x, layer.weight, layer.bias)[:rows]
    packed: torch.Tensor = torch.ops.mkl._mkl_linear(
        x.contiguous(), layer.packed, layer.weight, layer.bias, PACKED_ROWS
    )
    return packed[:rows]


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    if not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]
        return None
    packed: torch.Tensor = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACKED_ROWS)
    return packed
