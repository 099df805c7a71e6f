"""On a GPU: the real model's greedy tokens with the Triton kernels equal those with the torch
implementations on the same device (run with `pytest -m gpu`; skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pdserve.core.llm import LLM
from pdserve.core.outputs import RequestOutput
from pdserve.core.sampling_params import SamplingParams
from pdserve.kernels import _backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_greedy_tokens_with_triton_equal_torch_on_the_gpu(
    model_dir: Path, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    params = SamplingParams(max_tokens=16, temperature=0)
    with_triton = LLM(model_dir, device="cuda", num_kv_blocks=256).generate(prompts, params)
    monkeypatch.setattr(_backend, "use_triton", lambda device: False)
    with_torch = LLM(model_dir, device="cuda", num_kv_blocks=256).generate(prompts, params)
    assert _tokens(with_triton) == _tokens(with_torch)


def test_greedy_tokens_on_the_gpu_equal_transformers(
    model_dir: Path, prompts: list[list[int]], hf_greedy: list[list[int]], max_new_tokens: int
) -> None:
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0)
    outputs = LLM(model_dir, device="cuda", num_kv_blocks=256).generate(prompts, params)
    assert _tokens(outputs) == hf_greedy


def _tokens(outputs: list[RequestOutput]) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in outputs]
