"""What a pod's CPU limit gives: the same closed-loop load on colocated decode pods of different
sizes (`pdserve up --netns --pod-cpus`), each arm a fresh cluster, arms taking turns.

    pdserve bench pod-cpus [--arms 1x1.0,1x0.5,2x0.5] [--repeats 2] [--json]

An arm `NxC` is N decode pods (colocated: they prefill too) of C cores each. Every arm serves the
same requests (distinct random prompts, greedy, `ignore_eos`, so the work is the lengths), at the
same concurrency, through the router; the first requests of each cluster warm it up and are not
timed. Output tokens/s is the timed requests' output tokens over the wall time they took. Each
pod's throttled time (how long its quota held it back) says whether the limit was what bound.
The two figures the sizing needs: a 0.5 pod against a 1.0 pod (`half`: ~0.5 if a pod's speed
scales with its quota) and two 0.5 pods against one 1.0 pod (`two_halves`: ~1.0 if capacity is
what the quotas add up to).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pdserve.bench.arg_types import positive_int
from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import ClusterSpec

FIRST_ORDINARY_TOKEN = 100  # clear of the special tokens at the start of the vocabulary
BASE_PORT = 50500  # apart from the other benchmarks' ports
METRICS_BASE_PORT = 50600
WARM_UP_REQUESTS = 2


@dataclass(frozen=True)
class Arm:
    pods: int
    cores: float

    @property
    def name(self) -> str:
        return f"{self.pods}x{self.cores:g}"


@dataclass(frozen=True)
class ArmRun:
    arm: str
    repeat: int
    requests: int
    output_tokens: int
    seconds: float
    tokens_per_s: float
    throttled_s: float  # summed over the arm's pods, during the timed requests


def parse_arms(text: str) -> list[Arm]:
    arms = []
    for part in text.split(","):
        pods, _, cores = part.strip().partition("x")
        try:
            arm = Arm(int(pods), float(cores))
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{part!r}: an arm is NxC, e.g. 2x0.5") from error
        if arm.pods < 1 or not arm.cores > 0:
            raise argparse.ArgumentTypeError(f"{part!r}: N >= 1 pods of C > 0 cores")
        arms.append(arm)
    return arms


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", type=parse_arms, default=parse_arms("1x1.0,1x0.5,2x0.5"))
    parser.add_argument("--model", type=Path, default=None, help="default: the embedded model")
    parser.add_argument("--requests", type=positive_int, default=24, help="timed, per arm")
    parser.add_argument("--concurrency", type=positive_int, default=8)
    parser.add_argument("--prompt-tokens", type=positive_int, default=64)
    parser.add_argument("--max-tokens", type=positive_int, default=64)
    parser.add_argument("--repeats", type=positive_int, default=2)
    parser.add_argument("--log-dir", type=Path, default=None, help="the workers' logs")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


def run(args: argparse.Namespace) -> int:
    from pdserve.core.model.source import resolve_model

    model_dir = resolve_model(args.model)
    vocab_size = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    runs: list[ArmRun] = []
    for repeat in range(args.repeats):
        rng = random.Random(repeat)  # every arm of a repeat serves the same prompts
        count = WARM_UP_REQUESTS + args.requests
        prompts = [
            [rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(args.prompt_tokens)]
            for _ in range(count)
        ]
        for arm in args.arms:
            row = _run_arm(args, model_dir, arm, repeat, prompts)
            runs.append(row)
            _print(asdict(row), args.json)
    _print(_summary(args.arms, runs), args.json)
    return 0


def _run_arm(
    args: argparse.Namespace, model_dir: Path, arm: Arm, repeat: int, prompts: list[list[int]]
) -> ArmRun:
    from pdserve.local.pods import PodCluster  # dnslib: only for pods

    spec = ClusterSpec(
        model_dir=model_dir,
        num_prefill=0,
        num_decode=arm.pods,
        base_port=BASE_PORT,
        metrics_base_port=METRICS_BASE_PORT,
        http_port=0,
    )
    log_dir = None if args.log_dir is None else args.log_dir / f"{arm.name}-{repeat}"
    with PodCluster(spec, log_dir=log_dir, pod_cpus=arm.cores) as cluster:
        warm_up, timed = prompts[:WARM_UP_REQUESTS], prompts[WARM_UP_REQUESTS:]
        asyncio.run(_serve(cluster.router.address, warm_up, args.max_tokens, args.concurrency))
        throttled_before = sum(g.throttled_seconds() for g in cluster.cpu_groups())
        start = time.monotonic()
        tokens = asyncio.run(
            _serve(cluster.router.address, timed, args.max_tokens, args.concurrency)
        )
        seconds = time.monotonic() - start
        throttled = sum(g.throttled_seconds() for g in cluster.cpu_groups()) - throttled_before
    return ArmRun(arm.name, repeat, len(timed), tokens, seconds, tokens / seconds, throttled)


async def _serve(router: str, prompts: Sequence[list[int]], max_tokens: int, in_flight: int) -> int:
    """Closed loop: `in_flight` requests at a time until every prompt is served; the output
    tokens of all."""
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    queue = list(reversed(prompts))
    served = 0
    async with GenerationClient.connect(router) as client:

        async def worker() -> None:
            nonlocal served
            while queue:
                request = build_request(queue.pop(), sampling=sampling)
                response = await client.generate(request, timeout=600)
                served += len(response.token_ids)

        await asyncio.gather(*(worker() for _ in range(in_flight)))
    return served


def _summary(arms: list[Arm], runs: list[ArmRun]) -> dict[str, object]:
    means = {
        arm.name: statistics.mean(r.tokens_per_s for r in runs if r.arm == arm.name) for arm in arms
    }
    summary: dict[str, object] = {"mean_tokens_per_s": means, "repeats": len(runs) // len(arms)}
    whole = means.get("1x1")
    if whole:
        for name, key in (("1x0.5", "half"), ("2x0.5", "two_halves")):
            if name in means:
                summary[key] = means[name] / whole
    return summary


def _print(row: dict[str, object], as_json: bool) -> None:
    if as_json:
        print(json.dumps(row), flush=True)
    else:
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
