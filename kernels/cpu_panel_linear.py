"""Linear on the CPU over weights packed in panels (cpu_panel_linear.cpp): float32 activations
times float32 weights, or int8 weights with one scale per output channel (widened to float in
registers).

Why a kernel of our own, for each weight type:
- float32: oneDNN (the previous path, still the fallback: core/model/gemm.py) read the weights at
  about 20 GB/s at one row, where a 2-thread copy here moves 43-48 GB/s; a decode step at batch 1
  is almost all weight reads, so that rate was the step. This kernel streams them in order with a
  software prefetch: faster than oneDNN over a step's matmuls from 1 to 64 rows, level at prefill
  chunks of 512 (both at the FMA units' peak there); docs/kernels.md has the measurements
  (`pdserve bench linear --step`) and the engine A/B.
- int8: torch 2.13's `_weight_int8pack_mm` (the CPU op for this format) ran 3-30x slower than the
  float32 matmul it replaces, and the int8 kernels a library ships for x86 (fbgemm's dynamic
  quantized linear, oneDNN's) quantize the activations too, one scale per call: on the default
  model that took greedy agreement with float32 from 0.98 (weights alone) to 0.79 (`pdserve bench
  precision --quantization int8`). This kernel reads a quarter of float32's bytes and keeps the
  activations in float32, so its outputs differ from float32's by the weights' rounding alone.

The weights are packed at load into panels of 16 output channels, k-major (`pack`). A host runs
the widest vector path it has (`VectorPath`), AVX2 on AMD CPUs (`default_path_here`): AVX-512
(tiles of two panels, one register per row and panel), AVX2 + FMA (one panel, two registers per
row), else a portable loop. Built and
loaded as every CPU kernel of ours is (cpu_extensions.py); where it is not built,
core/model/gemm.py runs oneDNN (float32) or `_weight_int8pack_mm` (int8) on their own layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

from .cpu_extensions import SWITCH as SWITCH
from .cpu_extensions import CpuExtension

EXTENSION = CpuExtension(
    "pdserve_cpu_panel_linear",
    Path(__file__).with_name("cpu_panel_linear.cpp"),
    "float32 and int8-weight linear (oneDNN, torch's _weight_int8pack_mm)",
)
PANEL = 16  # output channels a panel holds (kPanel in the source)


@cache
def kernel() -> ModuleType | None:
    """The built kernel, or None: switched off, or never built here."""
    return EXTENSION.load()


class VectorPath(IntEnum):
    """The kernel's code paths, narrowest first (kPortable, kAvx2, kAvx512 in the source)."""

    PORTABLE = 0
    AVX2 = 1  # and FMA
    AVX512 = 2


@cache
def widest_path_here() -> VectorPath | None:
    """The widest path the built kernel runs on this CPU (None: not built)."""
    module = kernel()
    return None if module is None else VectorPath(module.widest_path_here())


@cache
def default_path_here() -> VectorPath | None:
    """The path the kernel takes on this CPU unless told (None: not built): the widest, but AVX2
    on AMD CPUs (the source says why)."""
    module = kernel()
    return None if module is None else VectorPath(module.default_path_here())


# The path `panel_linear` takes (None: `default_path_here()`; one wider than the CPU has runs the
# widest it has). `pdserve bench linear` sets it per arm.
PATH: VectorPath | None = None


def vectorized_here() -> bool:
    """Whether the built kernel runs a vector path on this CPU (else its portable loop)."""
    path = widest_path_here()
    return path is not None and path >= VectorPath.AVX2


@dataclass(frozen=True)
class Panels:
    # float32 or int8 [ceil(out / 16), in_features, 16]: channel j of panel p at [p, :, j]
    panels: torch.Tensor
    scales: torch.Tensor | None  # int8: float32 [ceil(out / 16) * 16], zero past out_features
    out_features: int


def pack(weight: torch.Tensor, scales: torch.Tensor | None = None) -> Panels:
    """`weight` [out, in] (float32, or int8 with its per-channel `scales`) in the kernel's panel
    layout; the last panel is zero-padded."""
    out_features, in_features = weight.shape
    num_panels = -(-out_features // PANEL)
    # One allocation and one strided copy: a zeroed padded copy transposed after cost three
    # passes over the weights, a third of a worker's start (a suite of clusters pays it often).
    panels = weight.new_empty(num_panels, in_features, PANEL)
    whole = out_features // PANEL
    by_panel = weight[: whole * PANEL].reshape(whole, PANEL, in_features)
    panels[:whole].copy_(by_panel.transpose(1, 2))
    if whole < num_panels:
        last = panels[whole]
        last.zero_()
        last[:, : out_features - whole * PANEL].copy_(weight[whole * PANEL :].t())
    if scales is None:
        return Panels(panels, None, out_features)
    padded_scales = torch.zeros(num_panels * PANEL, dtype=torch.float32)
    padded_scales[:out_features] = scales.float()
    return Panels(panels, padded_scales, out_features)


def panel_linear(
    x: torch.Tensor,
    panels: torch.Tensor,
    scales: torch.Tensor | None,
    out_features: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """`x @ W.T + bias` for float32 `x` of any leading shape; `panels`, `scales` and
    `out_features` as `pack` made them."""
    module = kernel()
    assert module is not None, "panel_linear called where the kernel is not built"
    out: torch.Tensor = module.panel_linear(x, panels, scales, bias, out_features, path_to_run())
    return out


def path_to_run() -> VectorPath:
    """`PATH`, else the default path of this CPU (the kernel must be built)."""
    path = PATH if PATH is not None else default_path_here()
    assert path is not None, "the panel kernel is not built"
    return path
