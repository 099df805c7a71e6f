"""Batch-1 decode step time of pdserve's engine against the memory-bandwidth floor.

A batch-1 decode step has to read every weight once, so `weight bytes / memory bandwidth` is the
fastest it can go. The bandwidth is measured in the same run (bench/offline/bounds.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pdserve.bench.offline.bounds import measure_copy_bandwidth
from pdserve.bench.offline.engines import BLOCK_SIZE, FLOAT32, Precision
from pdserve.core.llm import LLM
from pdserve.core.model.forward import CausalLM
from pdserve.core.model.gemm import weight_bytes
from pdserve.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class DecodeStepResult:
    prompt_tokens: int
    step_seconds: tuple[float, ...]  # every batch-1 decode step, engine.step() end to end
    forward_seconds: tuple[float, ...]  # the model forward inside each of those steps
    weight_bytes: int
    copy_bandwidth: float  # bytes/s, median of the copies

    @property
    def median_step(self) -> float:
        return statistics.median(self.step_seconds)

    @property
    def median_forward(self) -> float:
        return statistics.median(self.forward_seconds)

    @property
    def floor_seconds(self) -> float:
        return self.weight_bytes / self.copy_bandwidth

    @property
    def ratio(self) -> float:
        return self.median_step / self.floor_seconds


def model_weight_bytes(model: CausalLM) -> int:
    """Bytes of every weight a batch-1 forward reads: the embedding rows it gathers are few, so the
    embedding counts only where the lm_head reads it (tied, unpacked)."""
    projections = [model.lm_head]
    plain: list[torch.Tensor] = [model.norm]
    for layer in model.layers:
        plain += [layer.input_norm, layer.post_attention_norm]
        projections += [layer.qkv, layer.o_proj, layer.gate_up, layer.down]
    for projection in projections:
        plain += [t for t in (projection.bias, projection.scales) if t is not None]
    return sum(weight_bytes(p) for p in projections) + sum(t.nbytes for t in plain)


def measure_batch1_decode(
    model_dir: Path,
    prompt: list[int],
    num_steps: int,
    precision: Precision = FLOAT32,
) -> DecodeStepResult:
    """Times `num_steps` decode steps of one request (after its prefill step, and a warm-up)."""
    blocks = -(-(len(prompt) + num_steps + 1) // BLOCK_SIZE)
    llm = LLM(
        model_dir,
        max_num_seqs=1,
        num_kv_blocks=blocks,
        num_swap_blocks=0,
        dtype=precision.dtype,
        quantization=precision.quantization,
    )
    params = SamplingParams(max_tokens=num_steps + 1, temperature=0, ignore_eos=True)
    llm.generate([prompt[:8]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    model = llm.engine.runner.model
    forward_times: list[float] = []
    setattr(model, "forward", _timed(model.forward, forward_times))  # noqa: B010 (instance patch)
    llm.engine.add_request(prompt, params)
    llm.engine.step()  # the prefill step
    forward_times.clear()
    step_times = []
    while llm.engine.has_unfinished():
        start = time.perf_counter()
        llm.engine.step()
        step_times.append(time.perf_counter() - start)
    del model.forward  # back to the class's method
    bandwidth = measure_copy_bandwidth()
    return DecodeStepResult(
        prompt_tokens=len(prompt),
        step_seconds=tuple(step_times),
        forward_seconds=tuple(forward_times),
        weight_bytes=model_weight_bytes(model),
        copy_bandwidth=bandwidth,
    )


def _timed(function: Callable[..., Any], times: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = function(*args, **kwargs)
        times.append(time.perf_counter() - start)
        return result

    return timed


def report(result: DecodeStepResult) -> str:
    steps = sorted(result.step_seconds)
    p10, p90 = steps[len(steps) // 10], steps[(9 * len(steps)) // 10]
    return "\n".join(
        [
            f"batch-1 decode, prompt {result.prompt_tokens} tokens, {len(steps)} decode steps",
            f"  step (engine.step, median): {1e3 * result.median_step:.2f} ms "
            f"(p10 {1e3 * p10:.2f}, p90 {1e3 * p90:.2f})",
            f"  model forward (median):     {1e3 * result.median_forward:.2f} ms",
            f"  weights: {result.weight_bytes / 1e6:.1f} MB; copy bandwidth (read+write): "
            f"{result.copy_bandwidth / 1e9:.2f} GB/s",
            f"  floor = weights / bandwidth: {1e3 * result.floor_seconds:.2f} ms",
            f"  step / floor: {result.ratio:.2f}x (target <= 1.5x); "
            f"forward / floor: {result.median_forward / result.floor_seconds:.2f}x",
        ]
    )
