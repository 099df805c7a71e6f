"""The model's matmuls: our panel kernel for float32 on the CPU (oneDNN where it is not built),
`F.linear` elsewhere.

Float32 CPU weights are packed at load into the panels of kernels/cpu_panel_linear.py, whose
module docstring says why: oneDNN read weights at about 20 GB/s at one row, half the copy
bandwidth, and a batch-1 decode step is almost all weight reads. Where the kernel is not built
(no compiler; `PDSERVE_CPU_KERNELS=off`) oneDNN runs, as before it:

On the CPU `F.linear` runs MKL, whose float32 GEMV and small-row GEMMs are slow on the host class
this project now runs on (an AMD EPYC with AVX-512): the 49,152 x 576 lm_head at one row took
10.4-11.8 ms (about 10 GB/s of weights, no faster on two threads than on one), oneDNN's linear
5.4 ms. Over the default model's 211 weight shapes oneDNN was 1.49x faster at 1 row, 2.43x at 2,
1.54x at 16, 1.27x at 64 and 1.39x at 512, and the engine on `mixed` (32 requests, B=16, fresh
processes, arms alternating, greedy tokens identical) ran 88.1 / 96.8 against 67.0 / 60.6
tokens/s (docs/benchmarks.md). oneDNN's sums are not bit-identical to MKL's; the greedy tests
against transformers are what hold the model to its outputs.

Float32 weights are stored in oneDNN's blocked layout for 16-row inputs
(`PACKED_FOR_ROWS`), reordered once at load, so that no call pays for oneDNN's own reorder or
its slower path on the plain layout. `pdserve bench gemm-backend` measures it against the plain
layout and MKL (docs/benchmarks.md, "Packed weights"); packed for 64 rows did no better than for
16 in a first A/B. The packed tensor has no plain storage: only `linear` reads it.

It replaces an MKL-only path (inputs of 3-15 rows padded to 16, and MKL's packed GEMM with every
weight reordered for 16 rows: +0.5 GB resident) that paid 10-13 % on the earlier host class and
lost to oneDNN at every row count here. Other devices and dtypes use `F.linear`.

Int8 weight-only layers (`quantization="int8"`, see precision.py) with float32 activations run the
same panel kernel on int8 panels; where it is not built, or the activations are bfloat16 /
float16, torch's `_weight_int8pack_mm` runs the plain [out, in] int8 layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F

from pdserve.core.model.precision import quantize_int8
from pdserve.kernels import cpu_panel_linear

# torch builds without oneDNN (mkldnn) fall back to F.linear
ONEDNN_ON_CPU: bool = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
# Float32 CPU weights in the panel kernel's layout where it is built (False: oneDNN's;
# `pdserve bench gemm-backend` sets both switches per arm).
FLOAT32_PANELS = True
# The row count oneDNN's weight layout is chosen for: a decode batch of the default size (0: the
# plain layout).
PACKED_FOR_ROWS = 16


class WeightFormat(Enum):
    FLOAT = "float"  # [out, in] in the model's dtype (oneDNN's packed layout for CPU float32)
    FLOAT32_PANELS = "float32 panels"  # cpu_panel_linear's panels
    INT8_PANELS = "int8 panels"  # cpu_panel_linear's panels and scales, float32 activations
    INT8_ROWS = "int8 rows"  # [out, in] int8 for torch's _weight_int8pack_mm


PANEL_FORMATS = (WeightFormat.FLOAT32_PANELS, WeightFormat.INT8_PANELS)


@dataclass(frozen=True)
class LinearWeight:
    weight: torch.Tensor  # laid out as `format` says
    bias: torch.Tensor | None
    scales: torch.Tensor | None = None  # int8 formats: per output channel (zero-padded in panels)
    format: WeightFormat = WeightFormat.FLOAT
    out_features: int = 0  # panels: the channels before padding to whole panels

    @property
    def features(self) -> tuple[int, int]:
        """(out_features, in_features), whatever the layout."""
        if self.format in PANEL_FORMATS:
            return self.out_features, self.weight.shape[1]
        return self.weight.shape[0], self.weight.shape[1]


def prepare(
    weight: torch.Tensor, bias: torch.Tensor | None = None, quantization: str = "none"
) -> LinearWeight:
    if quantization == "int8":
        return _prepare_int8(weight, bias)
    if weight.device.type == "cpu" and weight.dtype == torch.float32 and _float32_panels_here():
        return _panel_layer(cpu_panel_linear.pack(weight), bias, WeightFormat.FLOAT32_PANELS)
    if PACKED_FOR_ROWS and _runs_on_onednn(weight, weight):
        weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACKED_FOR_ROWS)
    return LinearWeight(weight, bias)


def _prepare_int8(weight: torch.Tensor, bias: torch.Tensor | None) -> LinearWeight:
    quantized, scales = quantize_int8(weight)
    if weight.dtype == torch.float32 and cpu_panel_linear.kernel() is not None:
        packed = cpu_panel_linear.pack(quantized, scales)
        return _panel_layer(packed, bias, WeightFormat.INT8_PANELS)
    return LinearWeight(quantized, bias, scales, WeightFormat.INT8_ROWS)


def _panel_layer(
    packed: cpu_panel_linear.Panels, bias: torch.Tensor | None, format: WeightFormat
) -> LinearWeight:
    return LinearWeight(packed.panels, bias, packed.scales, format, packed.out_features)


def _float32_panels_here() -> bool:
    """The panels where their vector path runs; a CPU without AVX2 + FMA keeps oneDNN for float32
    (the portable loop was never measured against it). int8 takes the panels on any CPU."""
    return FLOAT32_PANELS and cpu_panel_linear.vectorized_here()


def cpu_float32_backend() -> str:
    """What runs float32 matmuls on the CPU, for whoever keys measurements by it (host profiles:
    a profile of one backend misprices another by up to 1.6x, as does one of the panel kernel's
    AVX2 path on an AVX-512 host)."""
    path = cpu_panel_linear.default_path_here()
    if _float32_panels_here() and path is not None:
        return f"panels-{path.name.lower()}"
    if not ONEDNN_ON_CPU:
        return "F.linear"
    return f"onednn-packed{PACKED_FOR_ROWS}" if PACKED_FOR_ROWS else "onednn"


def weight_bytes(layer: LinearWeight) -> int:
    """The bytes a forward reads of the layer's weight (packed weights have no plain storage)."""
    return layer.weight.numel() * layer.weight.element_size()


def linear(x: torch.Tensor, layer: LinearWeight) -> torch.Tensor:
    """`F.linear(x, weight, layer.bias)` for the layer's weight in its format."""
    if layer.format in PANEL_FORMATS:
        return cpu_panel_linear.panel_linear(
            x, layer.weight, layer.scales, layer.out_features, layer.bias
        )
    if layer.format is WeightFormat.INT8_ROWS:
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(x, layer.weight, layer.scales)
        return out if layer.bias is None else out + layer.bias
    if _runs_on_onednn(x, layer.weight):
        result: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, layer.weight, layer.bias, "none", [], ""
        )
        return result
    return F.linear(x, layer.weight, layer.bias)


def _runs_on_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        ONEDNN_ON_CPU
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
    )
