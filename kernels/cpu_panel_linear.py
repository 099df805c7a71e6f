"""Weight-only int8 linear on the CPU (cpu_panel_linear.cpp): float32 activations times int8
weights with one scale per output channel, the weights widened to float in registers.

Why a kernel of our own: torch 2.13's `_weight_int8pack_mm` (the CPU op for this format) ran 3-30x
slower than the float32 matmul it replaces (12.5 ms for the 49,152 x 576 lm_head at one row,
against 4.6 ms in float32), so int8 weights saved memory and cost speed. The int8 kernels a
library ships for x86 (fbgemm's dynamic quantized linear, oneDNN's) quantize the activations too,
one scale per call: on the default model that took greedy agreement with float32 from 0.98
(weights alone) to 0.79 (`pdserve bench precision --quantization int8`). This kernel reads a
quarter of float32's bytes and keeps the activations in float32, so its outputs differ from
float32's by the weights' rounding alone. docs/kernels.md has its A/B against float32.

The weights are packed at load into panels of 16 output channels, k-major (`pack`); AVX2+FMA
hosts run the vector path, others a portable loop. Built and loaded as every CPU kernel of ours
is (cpu_extensions.py); where it is not built, `_weight_int8pack_mm` runs the plain layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

from .cpu_extensions import SWITCH as SWITCH
from .cpu_extensions import CpuExtension

EXTENSION = CpuExtension(
    "pdserve_cpu_panel_linear",
    Path(__file__).with_name("cpu_panel_linear.cpp"),
    "int8-weight linear (torch's _weight_int8pack_mm)",
)
PANEL = 16  # output channels a panel holds (kPanel in the source)


@cache
def kernel() -> ModuleType | None:
    """The built kernel, or None: switched off, or never built here."""
    return EXTENSION.load()


@dataclass(frozen=True)
class Int8Panels:
    panels: (
        torch.Tensor
    )  # int8 [ceil(out / 16), in_features, 16]: channel j of panel p at [p, :, j]
    scales: torch.Tensor  # float32 [ceil(out / 16) * 16], zero past out_features
    out_features: int


def pack(quantized: torch.Tensor, scales: torch.Tensor) -> Int8Panels:
    """`quantized` int8 [out, in] and its per-channel `scales`, in the kernel's panel layout."""
    out_features, in_features = quantized.shape
    num_panels = -(-out_features // PANEL)
    padded = torch.zeros(num_panels * PANEL, in_features, dtype=torch.int8)
    padded[:out_features] = quantized
    padded_scales = torch.zeros(num_panels * PANEL, dtype=torch.float32)
    padded_scales[:out_features] = scales.float()
    panels = padded.view(num_panels, PANEL, in_features).transpose(1, 2).contiguous()
    return Int8Panels(panels, padded_scales, out_features)


def int8_linear(
    x: torch.Tensor,
    panels: torch.Tensor,
    scales: torch.Tensor,
    out_features: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """`x @ (q * scales).T + bias` for float32 `x` of any leading shape; `panels`, `scales` and
    `out_features` as `pack` made them."""
    module = kernel()
    assert module is not None, "int8_linear called where the kernel is not built"
    out: torch.Tensor = module.int8_linear(x, panels, scales, bias, out_features)
    return out
