"""A decoder layer's small ops: the residual add with RMSNorm, rotary embedding, SiLU(gate) * up.

On the CPU in float32 each runs as one call of cpu_layer_ops.cpp where it is built (cpu_extensions:
`./setup.sh` builds it, `PDSERVE_CPU_KERNELS=off` keeps torch); elsewhere (GPU, bfloat16 /
float16, no compiler) as the torch ops below. Why: `pdserve bench offline --profile` put a batch-1
decode step's norms, rotary and the rest of the layer's glue at 6-7 ms of a 35 ms step on this host
class, 140-350x the floor of the bytes they touch: each is several torch calls (F.rms_norm alone
is six) on a 576-wide row, dispatch overhead, not work. With int8 weights the matmuls shrank to a
third of the step and this overhead became the larger part. docs/kernels.md has the A/B.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from .cpu_extensions import CpuExtension

EXTENSION = CpuExtension(
    "pdserve_cpu_layer_ops",
    Path(__file__).with_name("cpu_layer_ops.cpp"),
    "the layers' RMSNorm, rotary and SiLU",
)


@cache
def kernel() -> ModuleType | None:
    """The built kernel, or None (torch runs): switched off, or never built here."""
    return EXTENSION.load()


def _on_kernel(x: torch.Tensor) -> ModuleType | None:
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    return kernel()


def add_rms_norm(
    hidden: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(RMSNorm(s) * weight, s)` for `s = hidden + residual` (`hidden` alone when `residual` is
    None), rows `[tokens, width]`. The kernel writes `s` into `residual` in place: the caller must
    own it (the model's residual stream does)."""
    module = _on_kernel(hidden)
    if module is not None:
        normed, total = module.add_rms_norm(hidden, residual, weight, eps)
        return normed, total
    total = hidden if residual is None else hidden + residual
    return rms_norm(total, weight, eps), total


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, in torch."""
    if x.dtype == torch.float32:  # one op; the same math as LlamaRMSNorm
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # Lower precisions normalise in float32 and cast back before the weight, as HF does.
    as_float = x.float()
    variance = as_float.pow(2).mean(-1, keepdim=True)
    normed = as_float * torch.rsqrt(variance + eps)
    return weight * normed.to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates `x` `[tokens, heads, dim]` by the step's `cos`, `sin` `[tokens, dim]` (q and k heads
    side by side, so one call serves both). The kernel rotates `x` in place and returns it."""
    module = _on_kernel(x)
    if module is not None:
        module.rotary_in_place(x, cos, sin)
        return x
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`SiLU(gate) * up` of `[rows, 2 * width]` holding gate then up."""
    module = _on_kernel(gate_up)
    if module is not None:
        out: torch.Tensor = module.silu_and_mul(gate_up)
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
