"""KV transfer time as a share of time-to-first-token, through real processes; whole-prompt push
vs layer-wise push side by side.

For each UCX transport, starts one router + 1 prefill + 1 decode on 127.0.0.1 (the `pdserve up`
layout) per `--layer-groups` value (decode's `--kv-layer-groups`: 1 = the whole prompt in one
message after the forward's last layer, k = k groups of layers, each pushed as soon as the forward
wrote it), all at once, and sends the prompts one at a time, round-robin over the clusters (so every
arm sees the same machine load and no queueing hides in the figures). Prints, per transport, length
and arm, the medians of the timings the router returns: prefill (queue end -> first token sampled;
with layer-wise push it includes the gathers made during the forward), transfer (open -> decode
holds every piece; overlaps the forward when layer-wise), TTFT, and `exposed` = TTFT - queue -
prefill: what the transfer (and the hops to decode) add after the first token is sampled.

    pdserve bench disagg-ttft --lengths 100,1000,4000 --requests 3 \\
        --transports sm,tcp --layer-groups 1,5,30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
from pathlib import Path

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.core.model.source import resolve_model
from pdserve.local.cluster import Cluster, ClusterSpec
from pdserve.v1 import common_pb2

TRANSPORTS = {"sm": "sm,self", "tcp": "tcp"}  # UCX_TLS values, as tests/transfer uses them
# Small pools: several clusters run at once; 300 blocks of 16 hold a 4,000-token prompt.
WORKER_ARGS = ("--num-kv-blocks", "300", "--num-swap-blocks", "16")
PORT_SPAN = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", default="100,1000", help="prompt lengths in tokens")
    parser.add_argument("--requests", type=int, default=10, help="requests per length and arm")
    parser.add_argument("--port", type=int, default=52051, help="first router port (others follow)")
    parser.add_argument("--transports", default="sm", help=f"from {sorted(TRANSPORTS)}")
    parser.add_argument("--layer-groups", default="1", help="decode --kv-layer-groups values")


def run(args: argparse.Namespace) -> int:
    lengths = [int(text) for text in args.lengths.split(",")]
    groups = [int(text) for text in args.layer_groups.split(",")]
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()} (before)")
    print("transport  prompt  groups  prefill_ms  transfer_ms  ttft_ms  exposed_ms  ttft/whole")
    for transport in args.transports.split(","):
        _run_transport(transport, lengths, groups, args.requests, args.port)
    print(f"load average {os.getloadavg()} (after)")
    return 0


def _run_transport(
    transport: str, lengths: list[int], groups: list[int], requests: int, port: int
) -> None:
    with contextlib.ExitStack() as stack:
        clusters = [
            stack.enter_context(_cluster(transport, count, port + i * PORT_SPAN))
            for i, count in enumerate(groups)
        ]
        for cluster in clusters:
            cluster.wait_ready()
        addresses = [c.router.address for c in clusters]
        asyncio.run(_measure(addresses, lengths[0], 1))  # warm-up: endpoints, staging pools
        for length in lengths:
            timings = asyncio.run(_measure(addresses, length, requests))
            whole_ttft = statistics.median(t.first_token_seconds for t in timings[0])
            for count, rows in zip(groups, timings, strict=True):
                _print_row(transport, length, count, rows, whole_ttft)


def _cluster(transport: str, layer_groups: int, port: int) -> Cluster:
    spec = ClusterSpec(
        model_dir=resolve_model(None),
        base_port=port,
        metrics_base_port=port + PORT_SPAN // 2,
        worker_args=WORKER_ARGS,
        env=(
            ("UCX_TLS", TRANSPORTS[transport]),
            ("UCX_NET_DEVICES", "lo"),
            ("UCX_WARN_UNUSED_ENV_VARS", "n"),
            ("PDSERVE_KV_LAYER_GROUPS", str(layer_groups)),
        ),
    )
    return Cluster(spec, Path(tempfile.mkdtemp(prefix="pdserve-ttft-")))


def _print_row(
    transport: str, length: int, groups: int, rows: list[common_pb2.Timings], whole_ttft: float
) -> None:
    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1e3

    prefill = ms([t.prefill_seconds for t in rows])
    transfer = ms([t.transfer_seconds for t in rows])
    ttft = ms([t.first_token_seconds for t in rows])
    exposed = ms([t.first_token_seconds - t.queue_seconds - t.prefill_seconds for t in rows])
    print(
        f"{transport:9s}  {length:6d}  {groups:6d}  {prefill:10.1f}  {transfer:11.1f}  "
        f"{ttft:7.1f}  {exposed:10.1f}  {ttft / (whole_ttft * 1e3):10.2f}"
    )


async def _measure(addresses: list[str], length: int, count: int) -> list[list[common_pb2.Timings]]:
    """`count` requests per cluster, one at a time, round-robin."""
    prompt = [100 + (i * 7919) % 40000 for i in range(length)]  # valid ids, no special tokens
    sampling = SamplingParams(max_tokens=1, temperature=0.0)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(GenerationClient.connect(address))
            for address in addresses
        ]
        timings: list[list[common_pb2.Timings]] = [[] for _ in clients]
        for _ in range(count):
            for client, rows in zip(clients, timings, strict=True):
                reply = await client.generate(build_request(prompt, sampling=sampling))
                rows.append(reply.timings)
        return timings
