"""`pdserve bench offload`: KV offload tiers below the pool, on and off, on multi-turn traffic.

    pdserve bench offload [--model PATH] [--workload FILE] [--tiers none,host,host+disk]
        [--placements disaggregated,colocated] [--repeats N] [--concurrency C]
        [--num-kv-blocks B] [--json]

Each arm is one cluster as `pdserve up` starts it (router, workers as real processes, KV over
UCX), on the same two cores: `disaggregated` is one prefill worker (core 0) and one decode worker
(core 1); `colocated` two decode workers (one core each) that prefill their own prompts; the
router routes by prefix (`--routing-policy prefix`) in both, so a conversation returns to the
worker that holds its history. Every worker gets the same small pool (`--num-kv-blocks`, 160:
the shipped workload's histories are 4x and more of it) and the arm's tiers below it:

    none        the pool's prefix cache alone
    host        + `--kv-offload-host-gb` (1 GB: every history fits)
    host+disk   + a small host tier (0.1 GB) and `--kv-offload-disk-gb` (2 GB) in a fresh folder

For each repeat the arms run in turn, their order rotated from one repeat to the next (so a host
that drifts in speed weighs on every arm alike). An arm starts its cluster, warms it up with
requests of random tokens that share nothing with the workload (not counted), then sends the
workload's requests in their order through C streams (a closed loop: a stream sends its next
request when its last one ends), greedy with `ignore_eos`. A row per arm and repeat:

    {"placement", "tiers", "repeat", "ttft_p50", "ttft_p90", "prefill_tokens_computed",
     "hit_tokens_by_tier": {"pool", "host", "disk"}, "tokens_per_s", ...}

`prefill_tokens_computed` and `hit_tokens_by_tier` are the prefilling workers' (prefill in the
disaggregated arm, the decode workers in the colocated one), from their /metrics before and after
the timed part; in the disaggregated arm `decode_promoted_tokens` counts the prompt tokens decode
took from its own tiers instead of receiving them from prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from pdserve.bench.offline.make_workloads import FIRST_ID, VOCAB
from pdserve.bench.offline.workload import WorkloadRequest, workload_and_model
from pdserve.bench.offload.workload import WORKLOAD
from pdserve.bench.scrape import metric_samples
from pdserve.client import GenerationClient, build_request
from pdserve.core.config import EngineConfig
from pdserve.core.kv.offload import OffloadTier
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.serving.sampling_proto import sampling_to_proto
from pdserve.loadtest.stats import percentile
from pdserve.local.cluster import Cluster, ClusterSpec, Process
from pdserve.local.ports import free_port_bases
from pdserve.planner.real_runs import own_cores

UCX_ENV = (("UCX_WARN_UNUSED_ENV_VARS", "n"),)
PLACEMENTS = {"disaggregated": (1, 1), "colocated": (0, 2)}  # (prefill, decode) workers
TIERS = ("none", "host", "host+disk")
WARMUP_REQUESTS = 4  # per worker: random prompts sharing nothing with the workload
TIMEOUT_S = 600.0
BLOCK_SIZE = EngineConfig().block_size


@dataclass(frozen=True)
class ArmRow:
    placement: str
    tiers: str
    repeat: int
    ttft_p50: float
    ttft_p90: float
    prefill_tokens_computed: int
    prompt_tokens: int
    hit_tokens_by_tier: dict[str, int]
    decode_promoted_tokens: int  # disaggregated: prompt tokens decode had below its pool
    tokens_per_s: float
    output_tokens: int
    seconds: float
    requests: int
    workload: str
    num_kv_blocks: int
    concurrency: int
    loadavg_1m_before: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF model folder (default: SmolLM2)")
    parser.add_argument("--workload", type=Path, default=WORKLOAD)
    parser.add_argument("--tiers", default=",".join(TIERS), help=f"of {', '.join(TIERS)}")
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=4, help="streams in flight")
    parser.add_argument("--num-kv-blocks", type=int, default=160, help="every worker's pool")
    parser.add_argument("--host-gb", type=float, default=1.0, help="the host arm's host tier")
    parser.add_argument("--log-dir", type=Path, default=None, help="the workers' logs")
    parser.add_argument("--json", action="store_true", help="also print each row as JSON")


def run(args: argparse.Namespace) -> int:
    tiers, placements = args.tiers.split(","), args.placements.split(",")
    unknown = [t for t in tiers if t not in TIERS] + [p for p in placements if p not in PLACEMENTS]
    if unknown or args.repeats < 1 or args.concurrency < 1:
        print(f"error: unknown arms {unknown} or --repeats/--concurrency < 1")
        return 2
    loaded = workload_and_model(args.workload, args.model)
    if loaded is None:
        return 2
    requests, model_dir = loaded
    rows: list[ArmRow] = []
    for repeat in range(args.repeats):
        for placement in placements:
            shift = repeat % len(tiers)
            for arm_tiers in tiers[shift:] + tiers[:shift]:
                row = run_arm(args, model_dir, requests, placement, arm_tiers, repeat)
                rows.append(row)
                print_row(row, args.json)
    print_summary(rows)
    return 0


def run_arm(
    args: argparse.Namespace,
    model_dir: Path,
    requests: list[WorkloadRequest],
    placement: str,
    tiers: str,
    repeat: int,
) -> ArmRow:
    num_prefill, num_decode = PLACEMENTS[placement]
    base_port, metrics_base_port = free_port_bases(2)
    with tier_flags(tiers, args.host_gb) as offload:
        spec = ClusterSpec(
            model_dir=model_dir,
            num_prefill=num_prefill,
            num_decode=num_decode,
            base_port=base_port,
            metrics_base_port=metrics_base_port,
            worker_args=("--num-kv-blocks", str(args.num_kv_blocks), *offload),
            router_args=("--routing-policy", "prefix"),
            env=UCX_ENV,
            pins=own_cores(num_prefill, num_decode),
        )
        log_dir = None if args.log_dir is None else args.log_dir / f"{placement}-{tiers}-{repeat}"
        with Cluster(spec, log_dir) as cluster:
            cluster.wait_ready()
            asyncio.run(warm_up(cluster.router.address, num_prefill + num_decode))
            prefilling = cluster.prefill or cluster.decode
            before = [scrape(worker) for worker in cluster.processes if worker.role != "router"]
            load = os.getloadavg()[0]
            ttfts, output_tokens, seconds = asyncio.run(
                drive(cluster.router.address, requests, args.concurrency)
            )
            after = [scrape(worker) for worker in cluster.processes if worker.role != "router"]
    workers = [w for w in cluster.processes if w.role != "router"]
    computing = _delta(before, after, [w in prefilling for w in workers])
    disaggregated = bool(cluster.prefill)
    decoding = _delta(before, after, [disaggregated and w.role == "decode" for w in workers])
    ttfts.sort()
    return ArmRow(
        placement=placement,
        tiers=tiers,
        repeat=repeat,
        ttft_p50=percentile(ttfts, 50),
        ttft_p90=percentile(ttfts, 90),
        prefill_tokens_computed=int(computing["query"] - computing["hit"]),
        prompt_tokens=sum(len(r.prompt) for r in requests),
        hit_tokens_by_tier={
            "pool": int(computing["hit"] - computing["host"] - computing["disk"]),
            "host": int(computing["host"]),
            "disk": int(computing["disk"]),
        },
        decode_promoted_tokens=int(decoding["host"] + decoding["disk"]),
        tokens_per_s=output_tokens / seconds,
        output_tokens=output_tokens,
        seconds=seconds,
        requests=len(requests),
        workload=args.workload.name,
        num_kv_blocks=args.num_kv_blocks,
        concurrency=args.concurrency,
        loadavg_1m_before=load,
    )


@contextmanager
def tier_flags(tiers: str, host_gb: float) -> Iterator[tuple[str, ...]]:
    """The arm's offload flags; a fresh disk folder (removed after) so no arm finds another's
    blocks (`pdserve up` gives each worker a subfolder of it)."""
    if tiers == "none":
        yield ()
    elif tiers == "host":
        yield ("--kv-offload-host-gb", str(host_gb))
    else:
        folder = Path(tempfile.mkdtemp(prefix="pdserve-offload-bench-"))
        try:
            yield (
                *("--kv-offload-host-gb", "0.1", "--kv-offload-disk-gb", "2"),
                *("--kv-offload-disk-path", str(folder)),
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def scrape(worker: Process) -> dict[str, float]:
    """A worker's prefix-cache counters: tokens looked up, found, and promoted from each tier."""
    samples = metric_samples(worker.metrics_port, worker.host)
    tier = worker.role
    promoted = f"pdserve_{tier}_kv_offload_promoted_blocks"
    return {
        "query": samples[f"pdserve_{tier}_prefix_cache_query_tokens"],
        "hit": samples[f"pdserve_{tier}_prefix_cache_hit_tokens"],
        **{
            level.value: samples.get(f'{promoted}{{level="{level.value}"}}', 0.0) * BLOCK_SIZE
            for level in OffloadTier
        },
    }


def _delta(
    before: list[dict[str, float]], after: list[dict[str, float]], counted: list[bool]
) -> dict[str, float]:
    """The counted workers' counters summed, after minus before."""
    keys = ("query", "hit", *(level.value for level in OffloadTier))
    return {
        key: sum(a[key] - b[key] for a, b, c in zip(after, before, counted, strict=True) if c)
        for key in keys
    }


async def warm_up(address: str, num_workers: int) -> None:
    """Random prompts of 48-160 tokens that share no block with the workload or each other."""
    rng = random.Random(7)
    prompts = [
        [rng.randrange(FIRST_ID, VOCAB) for _ in range(rng.randint(48, 160))]
        for _ in range(WARMUP_REQUESTS * num_workers)
    ]
    params = sampling_to_proto(SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    async with GenerationClient.connect(address) as client:
        await asyncio.gather(
            *(
                client.generate(build_request(p, sampling=params), timeout=TIMEOUT_S)
                for p in prompts
            )
        )


async def drive(
    address: str, requests: list[WorkloadRequest], concurrency: int
) -> tuple[list[float], int, float]:
    """The requests in order through `concurrency` streams; their TTFTs, output tokens and the
    wall time."""
    queue: asyncio.Queue[WorkloadRequest] = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)
    ttfts: list[float] = []
    output_tokens = 0

    async def stream(client: GenerationClient) -> None:
        nonlocal output_tokens
        while not queue.empty():
            request = queue.get_nowait()
            sampling = SamplingParams(max_tokens=request.max_tokens, temperature=0, ignore_eos=True)
            message = build_request(list(request.prompt), sampling=sampling_to_proto(sampling))
            sent = time.perf_counter()
            first: float | None = None
            async for chunk in client.generate_stream(message, timeout=TIMEOUT_S):
                if first is None and chunk.token_ids:
                    first = time.perf_counter()
                    ttfts.append(first - sent)
                output_tokens += len(chunk.token_ids)

    async with GenerationClient.connect(address) as client:
        started = time.perf_counter()
        await asyncio.gather(*(stream(client) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return ttfts, output_tokens, seconds


def print_row(row: ArmRow, as_json: bool) -> None:
    hits = row.hit_tokens_by_tier
    print(
        f"{row.placement:>13} {row.tiers:>9} #{row.repeat}: TTFT p50 {row.ttft_p50:.3f} s "
        f"p90 {row.ttft_p90:.3f} s, prefill computed {row.prefill_tokens_computed} of "
        f"{row.prompt_tokens} prompt tokens (hits pool {hits['pool']}, host {hits['host']}, "
        f"disk {hits['disk']}; decode promoted {row.decode_promoted_tokens}), "
        f"{row.tokens_per_s:.1f} tokens/s (load {row.loadavg_1m_before:.2f})",
        flush=True,
    )
    if as_json:
        print(json.dumps(asdict(row)), flush=True)


def print_summary(rows: list[ArmRow]) -> None:
    """Per placement and tiers: medians over repeats of the ratios to `none` of the same
    repeat (computed tokens, TTFT p50 speed-up, tokens/s)."""
    baseline = {(r.placement, r.repeat): r for r in rows if r.tiers == "none"}
    groups: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for row in rows:
        base = baseline.get((row.placement, row.repeat))
        if base is None or row.tiers == "none":
            continue
        groups.setdefault((row.placement, row.tiers), []).append(
            (
                row.prefill_tokens_computed / max(base.prefill_tokens_computed, 1),
                base.ttft_p50 / row.ttft_p50,
                row.tokens_per_s / base.tokens_per_s,
            )
        )
    for (placement, tiers), ratios in groups.items():
        computed, ttft, speed = (statistics.median(column) for column in zip(*ratios, strict=True))
        print(
            f"{placement} {tiers} vs none: prefill computed {computed:.2f}x, TTFT p50 "
            f"{ttft:.2f}x better, tokens/s {speed:.2f}x ({len(ratios)} repeats, medians)"
        )
