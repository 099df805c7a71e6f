"""Writes the shipped offline workloads, deterministically (seeded), from random valid token ids.

    .venv/bin/pdserve bench make-workloads [--out bench/offline/workloads]

Random ids rather than real text: with greedy decoding and `ignore_eos` every request produces
exactly `max_tokens` whatever the prompt says, so throughput depends only on the lengths. Ids are
drawn from [FIRST_ID, VOCAB) of SmolLM2's vocabulary, which skips its special tokens (< 17).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from pdserve.bench.offline.workload import WORKLOAD_DIR, WorkloadRequest, save_workload

FIRST_ID = 100
VOCAB = 49152
NUM_REQUESTS = 64
SEED = 20240611


def mixed(rng: random.Random) -> list[WorkloadRequest]:
    """64 requests, prompt length uniform 10-100, max_tokens uniform 20-200 (both inclusive)."""
    return [
        WorkloadRequest(_prompt(rng, rng.randint(10, 100)), rng.randint(20, 200))
        for _ in range(NUM_REQUESTS)
    ]


def uniform(rng: random.Random) -> list[WorkloadRequest]:
    """64 requests, prompt length 64, max_tokens 100."""
    return [WorkloadRequest(_prompt(rng, 64), 100) for _ in range(NUM_REQUESTS)]


def _prompt(rng: random.Random, length: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_ID, VOCAB) for _ in range(length))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=WORKLOAD_DIR)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    save_workload(mixed(random.Random(SEED)), out / "mixed.json")
    save_workload(uniform(random.Random(SEED + 1)), out / "uniform.json")
    return 0
