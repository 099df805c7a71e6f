"""A/B of the CPU matmul backend (core/model/gemm.py): our panel kernel, oneDNN on weights packed
at load, oneDNN on the plain layout, and `F.linear` (MKL); the first 32 requests of `mixed` at
B=16, arms alternating, each run in a fresh process so all see the same machine; also the greedy
tokens of every arm, which must agree.

    pdserve bench gemm-backend [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

WORKLOAD = Path(__file__).parents[1] / "offline" / "workloads" / "mixed.json"
ARMS = ("panels", "onednn-packed", "onednn", "mkl")


def run_once(arm: str) -> dict[str, object]:
    """Output tokens/s of one continuous-batching pass and its tokens (in a child process)."""
    from pdserve.core.model import gemm

    gemm.FLOAT32_PANELS = arm == "panels"
    gemm.ONEDNN_ON_CPU = arm != "mkl"  # "mkl": what a torch build without oneDNN gets
    gemm.PACKED_FOR_ROWS = gemm.PACKED_FOR_ROWS if arm == "onednn-packed" else 0
    from pdserve.core.llm import LLM
    from pdserve.core.model.source import resolve_model
    from pdserve.core.sampling_params import SamplingParams

    requests = json.loads(WORKLOAD.read_text())[:32]
    llm = LLM(resolve_model(None), max_num_seqs=16, num_kv_blocks=1024, num_swap_blocks=0)
    llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    params = [
        SamplingParams(max_tokens=r["max_tokens"], temperature=0, ignore_eos=True) for r in requests
    ]
    start = time.perf_counter()
    outputs = llm.generate([r["prompt"] for r in requests], params)
    seconds = time.perf_counter() - start
    tokens = [list(sample.token_ids) for out in outputs for sample in out.outputs]
    return {"tokens_per_s": sum(map(len, tokens)) / seconds, "tokens": tokens}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.child:
        print(json.dumps(run_once(args.child)))
        return 0
    outputs: list[list[list[int]]] = []
    for _ in range(args.rounds):
        for arm in ARMS:
            command = [sys.executable, "-m", "pdserve", "bench", "gemm-backend", "--child", arm]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            row = json.loads(result.stdout.strip().splitlines()[-1])
            outputs.append(row["tokens"])
            print(f"{arm:13s} {row['tokens_per_s']:6.1f} tok/s", flush=True)
    print(f"greedy tokens identical across runs: {all(o == outputs[0] for o in outputs)}")
    return 0
