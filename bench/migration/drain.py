"""`pdserve bench migration`'s drain rows: how long a decode worker running K streams takes to
drain (move them live) and exit (module docstring of cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pdserve.bench.migration import harness
from pdserve.bench.scrape import metric_value
from pdserve.client import GenerationClient
from pdserve.local.cluster import Process

DRAIN_CONTEXT_TOKENS = 1000
# A drain's streams must all still run when the last of them has its first tokens (one prefill
# worker prefills them one after another), so they ask for far more than they get: once the
# drained worker has exited the benchmark cancels them.
DRAIN_MAX_TOKENS = 4096
DRAIN_POLL_S = 0.02


@dataclass(frozen=True)
class DrainRow:
    streams: int
    drain_s: float
    streams_moved_s: float
    held: int
    moved_live: int
    exit_code: int
    link: str


def drain_row(args: argparse.Namespace, model_dir: Path, vocab_size: int, count: int) -> DrainRow:
    rng = random.Random(f"{args.seed}-drain-{count}")
    length = DRAIN_CONTEXT_TOKENS - harness.TOKENS_BEFORE_MOVE
    prompts = [harness.random_prompt(rng, length, vocab_size) for _ in range(count)]
    with harness.running_cluster(args, model_dir, f"drain-{count}") as cluster:
        before = _router_count(cluster, "live")
        drain = asyncio.run(_drained(cluster, prompts))
        moved = int(_router_count(cluster, "live") - before)
        return DrainRow(
            count,
            drain.seconds,
            drain.moved_s,
            drain.held,
            moved,
            drain.exit_code,
            harness.link_name(args),
        )


@dataclass(frozen=True)
class Drain:
    seconds: float  # SIGTERM to exit
    moved_s: float  # SIGTERM to idle: the worker's pdserve_drain_seconds, last read before exit
    held: int  # streams the drained worker ran at the SIGTERM
    exit_code: int


async def _drained(cluster: harness.RunningCluster, prompts: list[tuple[int, ...]]) -> Drain:
    """Streams the prompts; once each has TOKENS_BEFORE_MOVE tokens, SIGTERM to the decode
    worker running the most of them: how long it takes to exit."""
    streams = [harness.Stream([], []) for _ in prompts]
    async with GenerationClient.connect(cluster.router.address) as client:
        tasks = [
            asyncio.ensure_future(harness.serve_stream(client, prompt, stream, DRAIN_MAX_TOKENS))
            for prompt, stream in zip(prompts, streams, strict=True)
        ]
        await harness.until_each_has(streams, harness.TOKENS_BEFORE_MOVE)
        running = {worker.name: await harness.num_running(worker) for worker in cluster.decode}
        source = max(cluster.decode, key=lambda worker: running[worker.name])
        signalled = time.monotonic()
        source.popen.send_signal(signal.SIGTERM)
        moved_s = await asyncio.to_thread(_last_drain_seconds, source)
        exit_code = source.popen.wait()
        drained = time.monotonic() - signalled
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return Drain(drained, moved_s, running[source.name], exit_code)


def _last_drain_seconds(worker: Process) -> float:
    """The worker's `pdserve_drain_seconds` as last read before its process exits: it grows
    while the worker drains and holds once it is idle, until the server stops."""
    last = 0.0
    while worker.popen.poll() is None:
        with contextlib.suppress(OSError, KeyError):
            last = metric_value(worker.metrics_port, "pdserve_drain_seconds", worker.host)
        time.sleep(DRAIN_POLL_S)
    return last


def _router_count(cluster: harness.RunningCluster, outcome: str) -> float:
    url = f"http://{cluster.router.host}:{cluster.router.metrics_port}/metrics"
    wanted = f'pdserve_router_migrations_total{{outcome="{outcome}"}} '
    with urllib.request.urlopen(url, timeout=5) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(wanted):
                return float(line.split()[1])
    return 0.0
