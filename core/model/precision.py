"""Opt-in lower precisions, and the check that the device can run the one asked for.

float32 is the default and the only token-exact path against transformers. Opt-in:
- `dtype="bfloat16"` (or float16): weights, activations and KV in that dtype; on a CPU only where
  oneDNN has native kernels for it (AVX-512 BF16 / AMX for bf16, AVX-512 FP16 / AMX-FP16 for fp16);
  elsewhere torch would emulate it at a fraction of float32's speed, so it is refused.
- `quantization="int8"`: weight-only int8 with one float scale per output channel (symmetric,
  absmax / 127) for every projection and the lm_head; activations stay in `dtype`. Runs on the
  CPU only (our kernel, kernels/cpu_panel_linear.py, or torch's `_weight_int8pack_mm` where it is
  not built), so it is refused on other devices.
Quality and speed of each against float32 and llama.cpp: docs/benchmarks.md.
"""

from __future__ import annotations

import torch

# Re-exported: bench/ imports it from here; the names live in core/config.py (torch-free).
from pdserve.core.config import QUANTIZATIONS as QUANTIZATIONS


class UnsupportedPrecisionError(ValueError):
    """The device cannot run the dtype / quantization asked for (the message says why)."""


def check_supported(dtype: torch.dtype, quantization: str, device: torch.device) -> None:
    if quantization not in QUANTIZATIONS:
        raise UnsupportedPrecisionError(
            f"quantization: must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}"
        )
    if quantization == "int8" and device.type != "cpu":
        raise UnsupportedPrecisionError(
            f"quantization: int8 weight-only runs on the CPU only (its kernels are CPU kernels), "
            f"not on {device.type}; use quantization none"
        )
    if device.type == "cpu" and not _cpu_runs(dtype):
        raise UnsupportedPrecisionError(
            f"dtype: {dtype} needs native CPU support (AVX-512 BF16 / FP16 or AMX), which this CPU "
            "lacks; use float32"
        )
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise UnsupportedPrecisionError(f"dtype: bfloat16 is not supported by {device}")


def _cpu_runs(dtype: torch.dtype) -> bool:
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return True


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: `weight ~= q * scales[:, None]` (scales: weight dtype)."""
    absmax = weight.float().abs().amax(dim=1).clamp(min=1e-12)
    scales = absmax / 127.0
    quantized = torch.round(weight.float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return quantized.contiguous(), scales.to(weight.dtype)
