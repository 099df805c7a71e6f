"""The engines the offline benchmark compares, each timed on the same workload.

- continuous: pdserve's engine (`LLM`, iteration-level scheduling, `max_num_seqs = B`);
- static: the same engine and runner with `StaticScheduler` (FCFS batches of B, admitted whole);
- hf: transformers `generate` on left-padded static batches of B in workload order (float32,
  attention mask, `max_new_tokens` = the batch's largest `max_tokens`, EOS disabled). Every row of
  a batch runs to that length, but only each request's own `max_tokens` count as output tokens.

Timing starts after the model is loaded and a tiny warm-up generate has run, and covers the whole
`generate` call (for ours: queueing, scheduling, forward, sampling, detokenizing).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pdserve.bench.offline.workload import WorkloadRequest, total_output_tokens
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams

WARMUP_PROMPT_TOKENS = 8
WARMUP_MAX_TOKENS = 4
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Precision:
    """pdserve's weights: EngineConfig's dtype and quantization (float32, none: the default)."""

    dtype: str = "float32"
    quantization: str = "none"

    @property
    def label(self) -> str:
        return self.dtype if self.quantization == "none" else f"{self.quantization}/{self.dtype}"


FLOAT32 = Precision()


class EngineKind(enum.Enum):
    CONTINUOUS = "continuous"
    STATIC = "static"
    HF = "hf"


@dataclass(frozen=True)
class EngineRun:
    """One timed run of one engine at one max batch size over a workload."""

    engine: EngineKind
    max_batch: int
    repeat: int
    num_requests: int
    output_tokens: int
    seconds: float
    cpu_seconds: float  # this process's CPU time (all threads) during the timed part
    load_seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        """Output tokens per CPU-second: less sensitive than wall time to other busy processes."""
        return self.output_tokens / self.cpu_seconds


Generate = Callable[[list[WorkloadRequest], int], int]


@dataclass(frozen=True)
class LoadedEngine:
    """An engine with its model loaded and warmed up, ready to be timed (again and again)."""

    kind: EngineKind
    max_batch: int
    generate: Generate
    load_seconds: float


def load_engine(
    kind: EngineKind,
    model_dir: Path,
    workload: list[WorkloadRequest],
    max_batch: int,
    precision: Precision = FLOAT32,
) -> LoadedEngine:
    """Loads the model and runs a tiny warm-up generate: none of it is in the timed part.
    `precision` applies to ours only (hf runs float32)."""
    started = time.perf_counter()
    if kind is EngineKind.HF:
        generate = _load_hf(model_dir)
    else:
        generate = _load_ours(kind, model_dir, workload, max_batch, precision)
    generate(_warmup_workload(workload), max_batch)
    return LoadedEngine(kind, max_batch, generate, time.perf_counter() - started)


def time_run(engine: LoadedEngine, workload: list[WorkloadRequest], repeat: int) -> EngineRun:
    """Times one pass over the whole workload (all requests queued at t=0)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    output_tokens = engine.generate(workload, engine.max_batch)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    expected = total_output_tokens(workload)
    if output_tokens != expected:
        raise RuntimeError(
            f"{engine.kind.value}: produced {output_tokens} tokens, expected {expected}"
        )
    return EngineRun(
        engine.kind,
        engine.max_batch,
        repeat,
        len(workload),
        output_tokens,
        seconds,
        cpu_seconds,
        engine.load_seconds,
    )


def _warmup_workload(workload: list[WorkloadRequest]) -> list[WorkloadRequest]:
    prompt = workload[0].prompt[:WARMUP_PROMPT_TOKENS]
    return [WorkloadRequest(prompt, WARMUP_MAX_TOKENS)] * 2


# -- ours ---------------------------------------------------------------------------------------


def build_llm(
    kind: EngineKind,
    model_dir: Path,
    workload: list[WorkloadRequest],
    max_batch: int,
    precision: Precision = FLOAT32,
) -> LLM:
    """An engine with room for the B largest requests at once, so nothing is ever preempted."""
    return LLM(
        model_dir,
        static_batching=kind is EngineKind.STATIC,
        max_num_seqs=max_batch,
        block_size=BLOCK_SIZE,
        num_kv_blocks=kv_blocks_needed(workload, max_batch),
        num_swap_blocks=0,
        dtype=precision.dtype,
        quantization=precision.quantization,
    )


def kv_blocks_needed(workload: list[WorkloadRequest], max_batch: int) -> int:
    needs = sorted(
        (blocks_for(len(r.prompt) + r.max_tokens, BLOCK_SIZE) for r in workload), reverse=True
    )
    return sum(needs[:max_batch])


def greedy_params(request: WorkloadRequest) -> SamplingParams:
    return SamplingParams(max_tokens=request.max_tokens, temperature=0, ignore_eos=True)


def _load_ours(
    kind: EngineKind,
    model_dir: Path,
    workload: list[WorkloadRequest],
    max_batch: int,
    precision: Precision,
) -> Generate:
    llm = build_llm(kind, model_dir, workload, max_batch, precision)

    def generate(requests: list[WorkloadRequest], _: int) -> int:
        outputs = llm.generate(
            [list(r.prompt) for r in requests], [greedy_params(r) for r in requests]
        )
        return sum(len(sample.token_ids) for output in outputs for sample in output.outputs)

    return generate


# -- transformers -------------------------------------------------------------------------------


def _load_hf(model_dir: Path) -> Generate:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    pad_id = model.generation_config.pad_token_id
    pad_id = 0 if pad_id is None else int(pad_id)
    # generate() fills unset fields from the model's own generation config, EOS included; clearing
    # it there is what makes every row run to max_new_tokens (our engines run with ignore_eos).
    model.generation_config.eos_token_id = None

    def generate(requests: list[WorkloadRequest], max_batch: int) -> int:
        produced = 0
        for batch in _batches(requests, max_batch):
            input_ids, mask = left_padded(batch, pad_id)
            max_new = max(r.max_tokens for r in batch)
            with torch.inference_mode():
                out = model.generate(
                    input_ids,
                    attention_mask=mask,
                    max_new_tokens=max_new,
                    do_sample=False,
                    pad_token_id=pad_id,
                    eos_token_id=None,
                )
            if out.shape[1] - input_ids.shape[1] != max_new:
                raise RuntimeError(f"hf: a batch stopped before max_new_tokens={max_new}")
            produced += sum(r.max_tokens for r in batch)
        return produced

    return generate


def left_padded(batch: list[WorkloadRequest], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts padded on the left to the longest one, and the mask that hides the padding."""
    width = max(len(r.prompt) for r in batch)
    ids = [[pad_id] * (width - len(r.prompt)) + list(r.prompt) for r in batch]
    mask = [[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in batch]
    return torch.tensor(ids), torch.tensor(mask)


def _batches(requests: list[WorkloadRequest], size: int) -> Iterator[list[WorkloadRequest]]:
    for start in range(0, len(requests), size):
        yield requests[start : start + size]
