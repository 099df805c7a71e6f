"""A decode-only step's decoder layers in one C++ call (cpu_decode_step.cpp), where the model's
float32 CPU forward otherwise makes about 35 torch ops and 9 kernel calls a layer.

Why: a batch-1 decode step of the default model is 30 layers of small work around its matmuls,
and the work between the kernels (splits, views, the cache's slices, `index_copy_`, the
dispatcher's checks, Python frames, a temporary per op) was ~3 ms of a ~19 ms step on the AMD
host class under `pdserve bench offline --profile` (forward_other, write_kv and the kernels'
glue), where llama.cpp's whole step was 18 ms. The fused call runs the same kernels (the per-op
modules' headers) in the same order on the same inputs: the logits and the cache are the
per-op path's bit for bit (tests/kernels/test_cpu_decode_step.py), so greedy output is unchanged.

It runs where every part of a layer has its CPU kernel: float32 activations on the CPU, weights
in panels (float32 or int8), a float32 KV cache, a step with no prefill chunk; anywhere else the
per-op path runs. It is built as every CPU kernel of ours is (cpu_extensions.py: `./setup.sh`
builds it, `PDSERVE_CPU_KERNELS=off` keeps the torch paths). It runs by default;
`PDSERVE_FUSED_DECODE=off` keeps the per-op path (as the serving figures in docs/ that say so
were measured), and `bench offline --profile` turns it off to time the parts of a step apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Protocol

import torch

from .cpu_extensions import CpuExtension

EXTENSION = CpuExtension(
    "pdserve_cpu_decode_step",
    Path(__file__).with_name("cpu_decode_step.cpp"),
    "a decode step's layers, op by op",
)
SWITCH = "PDSERVE_FUSED_DECODE"


# A linear as the kernel takes it: panels, scales (int8), bias, out_features
# (kernels/cpu_panel_linear.py `pack`).
PackedLinear = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, int]


class DecodeLayers(Protocol):
    """The C++ class: a model's layers, their weights held (not copied)."""

    @property
    def num_layers(self) -> int: ...

    def run(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        path: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer of a decode-only step: (hidden, residual) as the per-op loop leaves them
        (the residual is `hidden`, updated in place); each layer's K/V written to `kv_cache`."""
        ...


@cache
def kernel() -> ModuleType | None:
    """The built kernel unless `PDSERVE_FUSED_DECODE=off` (then None: the per-op path runs)."""
    if os.environ.get(SWITCH, "on") == "off":
        return None
    return EXTENSION.load()


@dataclass(frozen=True)
class LayerShapes:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    scale: float  # of the attention scores
    sliding_window: int  # 0: none


def decode_layers(
    norms: tuple[list[torch.Tensor], list[torch.Tensor]],
    linears: dict[str, list[PackedLinear]],
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    shapes: LayerShapes,
) -> DecodeLayers | None:
    """The layers in one C++ object, or None where the kernel is not built. `norms`: each
    layer's input and post-attention RMSNorm weights; `linears`: each layer's qkv, o_proj,
    gate_up and down; `cos_sin`: the rotary tables, [positions, head_dim]."""
    module = kernel()
    if module is None:
        return None
    layers: DecodeLayers = module.DecodeLayers(
        input_norms=norms[0],
        post_attention_norms=norms[1],
        qkv=linears["qkv"],
        o_proj=linears["o_proj"],
        gate_up=linears["gate_up"],
        down=linears["down"],
        cos=cos_sin[0],
        sin=cos_sin[1],
        num_heads=shapes.num_heads,
        num_kv_heads=shapes.num_kv_heads,
        head_dim=shapes.head_dim,
        eps=shapes.rms_norm_eps,
        scale=shapes.scale,
        sliding_window=shapes.sliding_window,
    )
    return layers
