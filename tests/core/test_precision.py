"""Opt-in precisions: int8 weight-only GEMM against float32, and refusals with clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pdserve.core.config import EngineConfig
from pdserve.core.llm import LLM
from pdserve.core.model.gemm import WeightFormat, linear, prepare
from pdserve.core.model.precision import (
    UnsupportedPrecisionError,
    check_supported,
    quantize_int8,
)
from pdserve.core.sampling_params import SamplingParams
from pdserve.kernels import cpu_panel_linear


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


def _dequantized_transformers(model_dir: Path) -> Any:
    """transformers' model with every weight pdserve quantizes replaced by its int8 rounding
    (q * scale): the model an int8 engine computes, with the lm_head untied from the embedding
    (pdserve quantizes the lm_head's copy, not the embedding rows it gathers)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                quantized, scales = quantize_int8(module.weight)
                module.weight.copy_(quantized.float() * scales[:, None])
                assert name == "lm_head" or ".layers." in name
    return model


def test_the_int8_engine_is_transformers_on_the_rounded_weights(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    """Through the engine (the kernel where built, every projection and the lm_head int8): the
    greedy tokens are those of transformers running the same rounded weights in float32."""
    chosen = [prompts[1], prompts[4], prompts[5]]  # 7, 63 and 130 tokens
    model = _dequantized_transformers(model_dir)
    expected = []
    with torch.inference_mode():
        for prompt in chosen:
            ids = torch.tensor([prompt])
            generated = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False
            )
            expected.append(generated[0, len(prompt) :].tolist())
    llm = LLM(model_dir, max_num_seqs=4, num_swap_blocks=0, quantization="int8")
    outputs = llm.generate(chosen, SamplingParams(max_tokens=24, temperature=0))
    assert [list(out.outputs[0].token_ids) for out in outputs] == expected
    built = cpu_panel_linear.kernel() is not None
    expected_format = WeightFormat.INT8_PANELS if built else WeightFormat.INT8_ROWS
    assert llm.engine.runner.model.lm_head.format is expected_format
