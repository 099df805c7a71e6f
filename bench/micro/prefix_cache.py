"""Prefix cache on vs off: 64 requests sharing a 512-token system prompt, distinct 20-100 tails.

All requests arrive at once. Colocated: the offline engine (`pdserve.LLM`), TTFT = first token's
wall time after the burst began. Disaggregated: router + 1 prefill + `--decode` decode workers
(real processes, UCX; `--routing-policy` is the router's), 64 concurrent unary calls, TTFT = the
router's `first_token_seconds`. Prefill tokens computed = prompt tokens admitted - tokens found in
the prefix cache (the engine's counters, or the prefill tier's /metrics). Disaggregated also
reports the KV bytes that crossed UCX (prefill's `pdserve_prefill_kv_sent_bytes`) and those decode
did not need because its prefix cache held the blocks (`pdserve_decode_kv_saved_bytes`).

    pdserve bench prefix-cache --mode colocated
    pdserve bench prefix-cache --mode disaggregated --port 55051
    pdserve bench prefix-cache --mode disaggregated --decode 2 --cache on \\
        --routing-policy prefix --port 55051   # then least-loaded: where repeats land
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.scrape import metric_value
from pdserve.client import GenerationClient, build_request
from pdserve.client import SamplingParams as WireSamplingParams
from pdserve.core.llm import LLM
from pdserve.core.model.source import resolve_model
from pdserve.core.sampling_params import SamplingParams
from pdserve.local.cluster import Cluster, ClusterSpec
from pdserve.router.placement.worker_choice import RoutingPolicy

SYSTEM_TOKENS = 512
MAX_TOKENS = 8
# 16 sequences of ~600 tokens fit 1024 blocks with or without the cache: no preemption either way,
# so the figures compare prefill work only (and 1024 blocks of SmolLM2 are ~0.7 GB per engine).
NUM_KV_BLOCKS = 1024
MAX_SEQS = 16


def workload(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(100, 49152) for _ in range(SYSTEM_TOKENS)]
    return [
        system + [rng.randrange(100, 49152) for _ in range(rng.randint(20, 100))]
        for _ in range(count)
    ]


@dataclass(frozen=True)
class Arm:
    """One run's figures: TTFT of each request, prompt tokens computed, KV bytes (disaggregated:
    sent over UCX, and saved by decode's prefix cache; None colocated)."""

    ttfts: list[float]
    computed: int
    kv_sent: int | None = None
    kv_saved: int | None = None


def colocated(prompts: list[list[int]], caching: bool) -> Arm:
    """TTFT of each prompt and the prompt tokens computed, through the offline engine."""
    llm = LLM(enable_prefix_caching=caching, num_kv_blocks=NUM_KV_BLOCKS, max_num_seqs=MAX_SEQS)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    start = time.monotonic()
    for index, prompt in enumerate(prompts):
        llm.engine.add_request(prompt, params, str(index))
    first: dict[str, float] = {}
    for delta in llm.stream():
        first.setdefault(delta.request_id, time.monotonic() - start)
    stats = llm.engine.stats()
    computed = stats.num_prefix_query_tokens - stats.num_prefix_hit_tokens
    return Arm([first[str(i)] for i in range(len(prompts))], computed)


def disaggregated(prompts: list[list[int]], caching: bool, args: argparse.Namespace) -> Arm:
    switch = () if caching else ("--no-prefix-cache",)
    worker_args = ("--num-kv-blocks", str(NUM_KV_BLOCKS), "--max-num-seqs", str(MAX_SEQS), *switch)
    spec = ClusterSpec(
        model_dir=resolve_model(None),
        num_decode=args.decode,
        base_port=args.port,
        metrics_base_port=args.port + 100,
        worker_args=worker_args,
        router_args=("--routing-policy", args.routing_policy),
        env=(("UCX_WARN_UNUSED_ENV_VARS", "n"),),
    )
    with Cluster(spec, Path(tempfile.mkdtemp(prefix="pdserve-prefix-"))) as cluster:
        cluster.wait_ready()
        ttfts = asyncio.run(_burst(cluster.router.address, prompts))
        prefill = cluster.prefill[0].metrics_port
        computed = metric_value(prefill, "pdserve_prefill_prompt_tokens_total") - (
            metric_value(prefill, "pdserve_prefill_prefix_cache_hit_tokens")
        )
        saved = sum(
            metric_value(d.metrics_port, "pdserve_decode_kv_saved_bytes") for d in cluster.decode
        )
        sent = metric_value(prefill, "pdserve_prefill_kv_sent_bytes")
    return Arm(ttfts, int(computed), int(sent), int(saved))


async def _burst(address: str, prompts: list[list[int]]) -> list[float]:
    sampling = WireSamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    async with GenerationClient.connect(address) as client:
        replies = await asyncio.gather(
            *(client.generate(build_request(p, sampling=sampling)) for p in prompts)
        )
    return [reply.timings.first_token_seconds for reply in replies]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=["colocated", "disaggregated"], default="colocated")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--port", type=int, default=55051, help="router port (disaggregated)")
    parser.add_argument("--decode", type=int, default=1, help="decode workers (disaggregated)")
    parser.add_argument(
        "--routing-policy",
        choices=[policy.value for policy in RoutingPolicy],
        default=RoutingPolicy.LEAST_LOADED.value,
        help="the router's (disaggregated)",
    )
    parser.add_argument(
        "--cache", choices=["both", "on", "off"], default="both", help="which arms to run"
    )
    parser.add_argument("--seed", type=int, default=11)


def run(args: argparse.Namespace) -> int:
    prompts = workload(args.requests, args.seed)
    print(f"{args.mode}: {len(prompts)} requests, {sum(map(len, prompts))} prompt tokens")
    if args.mode == "disaggregated":
        print(f"decode workers {args.decode}, routing policy {args.routing_policy}")
    print("cache  ttft_p50_s  ttft_p99_s  prefill_tokens_computed  kv_sent_MiB  kv_saved_MiB")
    for caching in {"both": (False, True), "on": (True,), "off": (False,)}[args.cache]:
        if args.mode == "colocated":
            arm = colocated(prompts, caching)
        else:
            arm = disaggregated(prompts, caching, args)
        p50 = statistics.median(arm.ttfts)
        p99 = statistics.quantiles(arm.ttfts, n=100, method="inclusive")[98]
        print(
            f"{'on' if caching else 'off':5}  {p50:10.2f}  {p99:10.2f}  {arm.computed:23d}  "
            f"{_mib(arm.kv_sent):>11}  {_mib(arm.kv_saved):>12}"
        )
    print(f"loadavg {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f}"
