"""`pdserve bench kv-int8`: what `--kv-cache-dtype int8` buys against the model-dtype cache.

Capacity: at one KV memory budget, each cache dtype gets `budget // block_nbytes` blocks, hence
`blocks // blocks_per_sequence` sequences of `--prompt-tokens + --max-tokens` tokens. Then a run
proves the engine holds that many: exactly that many requests are submitted at once, and the
largest number running in one step must be all of them (with no swap space and no preemption).

Speed: the same decode batch (`--batch` sequences with `--prompt-tokens` prompts) on both caches,
decode steps timed interleaved (int8 step, fp32 step, ...) so load drift hits both alike; the
median step of each and their ratio are reported, with the load average.

Quality is `pdserve bench precision --kv-cache-dtype int8`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.kv.cache import KVLayout
from pdserve.core.llm import LLM
from pdserve.core.model.source import resolve_model
from pdserve.core.sampling_params import SamplingParams

KV_DTYPES = ("auto", "int8")
MIB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget-mib", type=float, default=64.0, help="KV memory per engine")
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=28, help="output tokens each")
    parser.add_argument("--batch", type=int, default=16, help="decode batch of the speed A/B")
    parser.add_argument("--steps", type=int, default=20, help="timed decode steps per cache")
    parser.add_argument("--skip-capacity-run", action="store_true", help="arithmetic only")
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")


def run(args: argparse.Namespace) -> int:
    model_dir = resolve_model(args.model)
    seq_tokens = args.prompt_tokens + args.max_tokens
    prompt = [(7 * i) % 1000 + 100 for i in range(args.prompt_tokens)]
    for kv_dtype in KV_DTYPES:
        layout = _layout(model_dir, kv_dtype)
        blocks = int(args.budget_mib * MIB) // layout.block_nbytes
        per_seq = -(-seq_tokens // layout.block_size)
        record = {
            "kv_cache_dtype": layout.dtype,
            "block_nbytes": layout.block_nbytes,
            "budget_mib": args.budget_mib,
            "blocks": blocks,
            "tokens_per_sequence": seq_tokens,
            "max_sequences": blocks // per_seq,
        }
        if not args.skip_capacity_run:
            record.update(_hold(model_dir, kv_dtype, blocks, blocks // per_seq, prompt, args))
        print(json.dumps(record), flush=True)
    print(json.dumps(_speed(model_dir, prompt, args)), flush=True)
    return 0


def _layout(model_dir: Path, kv_dtype: str) -> KVLayout:
    return LLM(model_dir, num_kv_blocks=1, num_swap_blocks=0, kv_cache_dtype=kv_dtype).engine.layout


def _hold(
    model_dir: Path,
    kv_dtype: str,
    blocks: int,
    sequences: int,
    prompt: list[int],
    args: argparse.Namespace,
) -> dict[str, int]:
    """Runs `sequences` requests on `blocks` blocks; the most that ran in one step."""
    llm = LLM(
        model_dir,
        num_kv_blocks=blocks,
        num_swap_blocks=0,
        max_num_seqs=sequences,
        max_num_batched_tokens=max(EngineConfig().max_num_batched_tokens, len(prompt) * sequences),
        enable_prefix_caching=False,  # identical prompts must not share blocks here
        kv_cache_dtype=kv_dtype,
    )
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    for _ in range(sequences):
        llm.engine.add_request(list(prompt), params)
    most_running = 0
    while llm.engine.has_unfinished():
        llm.engine.step()
        most_running = max(most_running, llm.engine.stats().num_running)
    stats = llm.engine.stats()
    return {"most_running_in_one_step": most_running, "preemptions": stats.num_preemptions}


def _speed(model_dir: Path, prompt: list[int], args: argparse.Namespace) -> dict[str, object]:
    """Median decode step of the same batch on both caches, steps interleaved."""
    engines = {kv: _decoding(model_dir, kv, prompt, args) for kv in KV_DTYPES}
    times: dict[str, list[float]] = {kv: [] for kv in KV_DTYPES}
    load_before = os.getloadavg()[0]
    for _ in range(args.steps):
        for kv, llm in engines.items():
            started = time.perf_counter()
            llm.engine.step()
            times[kv].append(time.perf_counter() - started)
    medians = {kv: statistics.median(seconds) for kv, seconds in times.items()}
    return {
        "decode_batch": args.batch,
        "context_tokens": len(prompt),
        "median_step_ms": {kv: round(1000 * s, 2) for kv, s in medians.items()},
        "int8_over_auto": round(medians["int8"] / medians["auto"], 3),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": os.getloadavg()[0],
    }


def _decoding(model_dir: Path, kv_dtype: str, prompt: list[int], args: argparse.Namespace) -> LLM:
    """An engine whose `--batch` requests are past their prefill: every step is a decode step."""
    llm = LLM(model_dir, num_kv_blocks=1024, num_swap_blocks=0, kv_cache_dtype=kv_dtype)
    params = SamplingParams(max_tokens=args.steps + 2, temperature=0, ignore_eos=True)
    for index in range(args.batch):
        llm.engine.add_request([index + 1, *prompt], params)  # distinct: no prefix sharing
    while llm.engine.stats().num_waiting or any(
        request.num_computed_tokens < request.num_tokens - 1
        for request in llm.engine.requests.values()
    ):
        llm.engine.step()
    return llm
