"""End-to-end latency of fcfs vs sjf with Poisson arrivals, through the real offline engine.

First the capacity: the workload's requests all at t=0 under fcfs, capacity = requests / makespan.
Then, per policy (alternating, `--rounds` times each, so machine noise hits both alike), the same
requests arrive as a seeded Poisson process at `--load` x capacity; between engine steps every
request whose arrival time has passed is added, and e2e latency is finish - arrival, wall clock
(idle gaps are skipped, not slept).
The prefix cache is off: the rounds repeat the same prompts, and only the policy may differ.

    pdserve bench sjf-latency --requests 32 --load 0.8 --rounds 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from pdserve.bench.offline.workload import WORKLOAD_DIR, WorkloadRequest, load_workload
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams


def run_arrivals(llm: LLM, requests: list[WorkloadRequest], arrival_s: list[float]) -> list[float]:
    """Feeds requests at their arrival offsets; each one's finish - arrival, in input order."""
    engine = llm.engine
    start = time.monotonic()
    latencies: dict[str, float] = {}
    arrived_at: dict[str, float] = {}
    next_index = 0
    while len(latencies) < len(requests):
        now = time.monotonic() - start
        while next_index < len(requests) and arrival_s[next_index] <= now:
            request = requests[next_index]
            params = SamplingParams(max_tokens=request.max_tokens, temperature=0, ignore_eos=True)
            request_id = engine.add_request(list(request.prompt), params, str(next_index))
            arrived_at[request_id] = arrival_s[next_index]
            next_index += 1
        if not engine.has_unfinished():
            start -= max(0.0, arrival_s[next_index] - now)  # skip idle time instead of sleeping
            continue
        for delta in engine.step():
            if delta.finished:
                latencies[delta.request_id] = (
                    time.monotonic() - start - arrived_at[delta.request_id]
                )
    return [latencies[str(index)] for index in range(len(requests))]


def poisson_offsets(count: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(count):
        now += rng.expovariate(rate)
        offsets.append(now)
    return offsets


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", type=Path, default=WORKLOAD_DIR / "mixed.json")
    parser.add_argument("--load", type=float, default=0.8, help="arrival rate / capacity")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="runs per policy, alternating")
    parser.add_argument("--requests", type=int, default=32, help="the workload's first N")
    parser.add_argument("--seed", type=int, default=7)


def run(args: argparse.Namespace) -> int:
    requests = load_workload(args.workload)[: args.requests]
    engines = {
        policy: LLM(policy=policy, max_num_seqs=args.max_num_seqs, enable_prefix_caching=False)
        for policy in ("fcfs", "sjf")
    }
    compare_policies(
        lambda policy, offsets: run_arrivals(engines[policy], requests, offsets),
        len(requests),
        args,
        "s",
    )
    print(f"loadavg {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


def compare_policies(
    run: Callable[[str, list[float]], list[float]],
    count: int,
    args: argparse.Namespace,
    unit: str,
) -> None:
    """Capacity from a burst under fcfs, then both policies on the same Poisson schedules."""
    makespan = max(run("fcfs", [0.0] * count))
    rate = args.load * count / makespan
    print(f"capacity {count / makespan:.4f} req/{unit} (makespan {makespan:.1f} {unit})")
    results: dict[str, list[float]] = {"fcfs": [], "sjf": []}
    for round_index in range(args.rounds):
        offsets = poisson_offsets(count, rate, args.seed + round_index)
        for policy, latencies in results.items():
            latencies.extend(run(policy, offsets))
    print(f"policy  mean_e2e_{unit}  p99_e2e_{unit}  requests")
    for policy, latencies in results.items():
        mean = statistics.fmean(latencies)
        print(f"{policy:6}  {mean:10.2f}  {p99(latencies):9.2f}  {len(latencies):8}")
