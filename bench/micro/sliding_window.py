"""Sliding window vs full attention, one model shape: KV bytes per transfer, blocks per sequence.

Two models built with transformers (`pdserve.testing.window_model`), the same shape and weights
(seed): one attends within a `--window`-token sliding window, the other to everything. Each serves
one `--prompt-tokens` prompt of random token ids and `--max-tokens` new ones through router + 1
prefill + 1 decode (real processes, UCX). The figures come from the workers' /metrics: the KV
bytes prefill sent over UCX (`pdserve_prefill_kv_sent_bytes`), and the most blocks decode held
while the tokens streamed (`pdserve_decode_kv_free_blocks`, read after every token; the sequence
is alone on the worker, so what is held is its memory).

The default shape has the embedded model's KV layout (30 layers, 3 KV heads of 64, float32:
720 KiB per 16-token block) on a narrow residual stream, so the bytes are what that layout would
move and the run takes seconds.

    pdserve bench sliding-window --prompt-tokens 4000 --window 512 --port 55061
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.arg_types import positive_int
from pdserve.bench.scrape import metric_value
from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.model.source import resolve_model
from pdserve.local.cluster import Cluster, ClusterSpec
from pdserve.testing.window_model import WindowModelShape, build_window_model

BLOCK_SIZE = 16
# The embedded model's KV layout with a narrow residual stream (3 query heads of 64).
SHAPE = WindowModelShape(
    num_layers=30, hidden_size=192, intermediate_size=256, num_heads=3, num_kv_heads=3, head_dim=64
)


@dataclass(frozen=True)
class Arm:
    window: int | None
    kv_sent_bytes: int
    peak_decode_blocks: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-tokens", type=positive_int, default=4000)
    parser.add_argument("--window", type=positive_int, default=512)
    parser.add_argument("--max-tokens", type=positive_int, default=64)
    parser.add_argument("--num-kv-blocks", type=positive_int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=positive_int, default=55061, help="router port")


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    prompt = [rng.randrange(100, 49152) for _ in range(args.prompt_tokens)]
    block_nbytes = (
        SHAPE.num_layers * 2 * BLOCK_SIZE * SHAPE.num_kv_heads * SHAPE.head_dim * 4
    )  # float32
    print(
        f"prompt {len(prompt)} tokens + {args.max_tokens} new, block {BLOCK_SIZE} tokens = "
        f"{block_nbytes} bytes ({SHAPE.num_layers} layers x {SHAPE.num_kv_heads} KV heads x "
        f"{SHAPE.head_dim}, float32), prompt blocks {blocks_for(len(prompt), BLOCK_SIZE)}"
    )
    print("window  kv_sent_bytes  kv_sent_blocks  peak_decode_blocks  peak_decode_MiB")
    with tempfile.TemporaryDirectory(prefix="pdserve-window-") as scratch:
        for window in (None, args.window):
            arm = _measure(Path(scratch), window, prompt, args)
            print(
                f"{arm.window or 'none':>6}  {arm.kv_sent_bytes:13d}  "
                f"{arm.kv_sent_bytes // block_nbytes:14d}  {arm.peak_decode_blocks:18d}  "
                f"{arm.peak_decode_blocks * block_nbytes / 2**20:15.1f}"
            )
    print(f"loadavg {Path('/proc/loadavg').read_text().split()[:3]}")
    return 0


def _measure(scratch: Path, window: int | None, prompt: list[int], args: argparse.Namespace) -> Arm:
    name = f"w{window}" if window else "full"
    model = build_window_model(scratch / name, resolve_model(None), window, shape=SHAPE)
    spec = ClusterSpec(
        model_dir=model,
        base_port=args.port,
        metrics_base_port=args.port + 100,
        worker_args=("--num-kv-blocks", str(args.num_kv_blocks), "--block-size", str(BLOCK_SIZE)),
        env=(("UCX_WARN_UNUSED_ENV_VARS", "n"),),
        http_port=0,
    )
    with Cluster(spec, scratch / f"{name}-logs") as cluster:
        cluster.wait_ready()
        decode = cluster.decode[0].metrics_port
        peak = asyncio.run(_stream(cluster.router.address, prompt, args, decode))
        sent = metric_value(cluster.prefill[0].metrics_port, "pdserve_prefill_kv_sent_bytes")
    return Arm(window, int(sent), peak)


async def _stream(
    address: str, prompt: list[int], args: argparse.Namespace, decode_metrics: int
) -> int:
    """Streams the prompt's tokens; the most blocks decode held after any of them."""
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    peak = 0
    async with GenerationClient.connect(address) as client:
        async for _ in client.generate_stream(build_request(prompt, sampling=sampling)):
            free = metric_value(decode_metrics, "pdserve_decode_kv_free_blocks")
            peak = max(peak, args.num_kv_blocks - int(free))
    return peak
