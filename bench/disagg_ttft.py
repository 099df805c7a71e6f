"""KV transfer time as a share of time-to-first-token, through real processes.

Starts router + 1 prefill + 1 decode on 127.0.0.1 (the `pdserve up` layout, UCX between the
tiers), sends prompts of the given lengths one at a time (so no queueing hides in the figures) and
prints, per length, the medians of the timings the router returns: prefill compute, KV transfer
(gather + UCX until decode holds the bytes) and first-token latency, and transfer / TTFT.

    python -m pdserve.bench.disagg_ttft --lengths 100,1000 --requests 10
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.cluster import Cluster, ClusterSpec
from pdserve.core.model.source import resolve_model
from pdserve.v1 import common_pb2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="100,1000", help="prompt lengths in tokens")
    parser.add_argument("--requests", type=int, default=10, help="requests per length")
    parser.add_argument("--port", type=int, default=52051, help="router port (workers follow)")
    args = parser.parse_args()
    spec = ClusterSpec(
        model_dir=resolve_model(None),
        base_port=args.port,
        metrics_base_port=args.port + 100,
        env=(("UCX_WARN_UNUSED_ENV_VARS", "n"),),
    )
    with Cluster(spec, Path(tempfile.mkdtemp(prefix="pdserve-ttft-"))) as cluster:
        cluster.wait_ready()
        lengths = [int(text) for text in args.lengths.split(",")]
        print("prompt  prefill_ms  transfer_ms  ttft_ms  transfer/ttft")
        for length in lengths:
            timings = asyncio.run(_measure(cluster.router.address, length, args.requests))
            prefill = statistics.median(t.prefill_seconds for t in timings) * 1e3
            transfer = statistics.median(t.transfer_seconds for t in timings) * 1e3
            ttft = statistics.median(t.first_token_seconds for t in timings) * 1e3
            share = statistics.median(t.transfer_seconds / t.first_token_seconds for t in timings)
            print(f"{length:6d}  {prefill:10.1f}  {transfer:11.1f}  {ttft:7.1f}  {share:12.1%}")


async def _measure(address: str, length: int, count: int) -> list[common_pb2.Timings]:
    prompt = [100 + (i * 7919) % 40000 for i in range(length)]  # valid ids, no special tokens
    sampling = SamplingParams(max_tokens=1, temperature=0.0)
    async with GenerationClient.connect(address) as client:
        await client.generate(build_request(prompt, sampling=sampling))  # warm-up
        return [
            (await client.generate(build_request(prompt, sampling=sampling))).timings
            for _ in range(count)
        ]


if __name__ == "__main__":
    main()
