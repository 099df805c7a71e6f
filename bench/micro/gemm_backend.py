"""A/B of the packed small-batch GEMM (core/model/gemm.py): the first 32 requests of `mixed` at
B=16, packing on and off alternately, each run in a fresh process so both see the same machine.

    pdserve bench packed-gemm [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

WORKLOAD = Path(__file__).parent / "workloads" / "mixed.json"


def run_once(packed: bool) -> float:
    """Output tokens/s of one continuous-batching pass (called in a child process)."""
    from pdserve.core.model import gemm

    if not packed:
        gemm._pack = lambda weight: None  # what a machine without MKL gets
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
    tokens = sum(len(sample.token_ids) for out in outputs for sample in out.outputs)
    return tokens / (time.perf_counter() - start)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", choices=["packed", "plain"], help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.child:
        print(run_once(args.child == "packed"))
        return 0
    for _ in range(args.rounds):
        for mode in ("packed", "plain"):
            command = [sys.executable, "-m", "pdserve", "bench", "packed-gemm", "--child", mode]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            print(f"{mode:7s} {float(result.stdout.strip().splitlines()[-1]):6.1f} tok/s")
    return 0
