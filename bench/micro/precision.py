"""`pdserve bench precision`: an opt-in precision's quality against float32 on the same prompts.

The precision is the weights' (`--dtype`, `--quantization`) and/or the KV cache's
(`--kv-cache-dtype int8`: K and V rounded to int8 rows as they are written, read dequantized).

float32 generates greedily for each workload prompt (up to `--max-tokens`); then both models score
that same text teacher-forced (one prefill forward over prompt + output, logits at every output
position). Reported: greedy-token agreement (share of output positions where the candidate's
argmax is float32's token) and the mean absolute difference of the log-probabilities of float32's
tokens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from pdserve.bench.offline.workload import WORKLOAD_DIR, workload_and_model
from pdserve.core.config import KV_CACHE_DTYPES
from pdserve.core.forward_batch import ForwardBatch, PrefillMetadata
from pdserve.core.kv.cache import DTYPES, KVCache, KVLayout
from pdserve.core.llm import LLM
from pdserve.core.model.config import load_model_config
from pdserve.core.model.forward import CausalLM, load_model
from pdserve.core.model.precision import QUANTIZATIONS
from pdserve.core.sampling_params import SamplingParams

BLOCK_SIZE = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", type=Path, default=WORKLOAD_DIR / "mixed.json")
    parser.add_argument("--requests", type=int, default=16, help="first N prompts of the workload")
    parser.add_argument("--max-tokens", type=int, default=64, help="float32 output tokens each")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")


def run(args: argparse.Namespace) -> int:
    inputs = workload_and_model(args.workload, args.model)
    if inputs is None:
        return 2
    workload, model_dir = inputs
    workload = workload[: args.requests]
    reference = LLM(model_dir, max_num_seqs=len(workload), num_swap_blocks=0)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    outputs = reference.generate([list(r.prompt) for r in workload], params)
    texts = [
        (list(r.prompt), list(o.outputs[0].token_ids))
        for r, o in zip(workload, outputs, strict=True)
    ]
    fp32 = reference.engine.runner.model
    config = load_model_config(model_dir)
    candidate = load_model(
        model_dir, config, DTYPES[args.dtype], torch.device("cpu"), args.quantization
    )
    kv_dtype = args.dtype if args.kv_cache_dtype == "auto" else args.kv_cache_dtype
    agree, positions, diff = 0, 0, 0.0
    for prompt, output in texts:
        ours = _output_logprobs(fp32, prompt, output, "float32")
        theirs = _output_logprobs(candidate, prompt, output, kv_dtype)
        chosen = torch.tensor(output)
        agree += int((theirs.argmax(-1) == chosen).sum())
        positions += len(output)
        rows = torch.arange(len(output))
        diff += float((ours[rows, chosen] - theirs[rows, chosen]).abs().sum())
    record = {
        "dtype": args.dtype,
        "quantization": args.quantization,
        "kv_cache_dtype": kv_dtype,
        "requests": len(texts),
        "positions": positions,
        "greedy_agreement": round(agree / positions, 4),
        "mean_abs_logprob_diff": round(diff / positions, 5),
    }
    print(json.dumps(record))
    return 0


def _output_logprobs(
    model: CausalLM, prompt: list[int], output: list[int], kv_dtype: str
) -> torch.Tensor:
    """Log-probabilities `[len(output), vocab]` predicting each output token, teacher-forced,
    over a KV cache of `kv_dtype` (every token's K/V is written to it, then read back)."""
    tokens = prompt + output[:-1]
    n = len(tokens)
    config = model.config
    layout = KVLayout(config.num_layers, config.num_kv_heads, config.head_dim, BLOCK_SIZE, kv_dtype)
    blocks = -(-n // BLOCK_SIZE)
    cache = KVCache(layout, blocks, torch.device("cpu"))
    batch = ForwardBatch(
        input_ids=torch.tensor(tokens),
        positions=torch.arange(n),
        slot_mapping=torch.arange(n),
        num_decode_tokens=0,
        decode=None,
        prefill=PrefillMetadata(
            block_tables=torch.arange(blocks, dtype=torch.int32).unsqueeze(0),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32),
            context_lens=torch.tensor([n], dtype=torch.int32),
        ),
        logits_indices=torch.arange(len(prompt) - 1, n),
    )
    return torch.log_softmax(model.forward(batch, cache), dim=-1)
