"""Router relay capacity: tokens a `pdserve router` relays per second of its own CPU.

    .venv/bin/pdserve bench router --capacity [--concurrency 16,64,256,1024] [--duration S]
        [--relay multiplexed,per-request] [--step-ms MS] [--json]

Zero-work fake tiers (`--serve-fakes`: decode emits one token per running request per step) run
in a process of their own. With `--step-ms 0` (the default) decode steps as fast as the router
reads: a step once the last one was read, so every message carries one step. With `--step-ms MS`
its engine steps every MS ms on its own clock, as a real decode worker's does, and what it made
while the router was reading goes out as one message (as decode_service/multiplex.py sends): the
offered load is concurrency / MS tokens per ms, whatever the router manages; each fake answer
and per-request token then takes a step too, so both paths are offered the same. For each
`--relay` path a real `pdserve router` process runs pinned alone to one core (the other cores
hold the fakes and this client); per concurrency N, N client streams (GenerateStream,
`--tokens-per-request` tokens each, a new one as soon as one ends, spread over `--clients`
processes) are counted for `--duration` seconds. Router CPU is its utime + stime from /proc
over that window. One row per (relay, concurrency):

    {"relay": ..., "concurrency": N, "tokens_per_s": ..., "router_cpu": fraction of a core,
     "tokens_per_router_cpu_s": ..., "gap_p50_ms": ..., "gap_p99_ms": ..., "errors": n,
     "step_ms": ..., "tokens_per_chunk": ...}

`gap_*`: the time between two consecutive chunks of one stream as the client receives them
(a coalesced chunk carries several tokens); `tokens_per_chunk`, the tokens per such chunk (1:
no coalescing). `errors`: calls that ended with a status other than OK inside the window.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from pdserve.bench.router.stats import percentile
from pdserve.client import build_request
from pdserve.v1 import common_pb2, generation_pb2_grpc

if TYPE_CHECKING:
    from pdserve.v1.generation_pb2_grpc import GenerationAsyncStub

PROMPT_IDS = list(range(1, 65))  # 64 tokens
STREAMS_PER_CHANNEL = 64  # client channels, so one HTTP/2 connection does not carry them all
WARMUP_S = 1.0  # each client's streams run this long before the window opens
CLIENT_START_TIMEOUT_S = 300.0  # a client process that has not started by then fails the row
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CapacityRow:
    relay: str
    concurrency: int
    tokens_per_s: float
    router_cpu: float
    tokens_per_router_cpu_s: float
    gap_p50_ms: float
    gap_p99_ms: float
    errors: int
    step_ms: float  # the fake decode's step (0: paced by the router)
    tokens_per_chunk: float  # tokens per message the clients got: the coalescing


@dataclass
class ClientTally:
    """What the client streams saw inside the timed window."""

    measuring: bool = False
    tokens: int = 0
    chunks: int = 0
    errors: int = 0
    gaps: list[float] = field(default_factory=list)


def split_cores() -> tuple[int | None, set[int]]:
    """The core the router gets alone, and the rest (fakes, client); no pinning on one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None, set(cores)
    return cores[-1], set(cores[:-1])


def router_cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`, in seconds (/proc/PID/stat fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


async def _stream_loop(
    stub: GenerationAsyncStub, tokens_per_request: int, tally: ClientTally
) -> None:
    sampling = common_pb2.SamplingParams(max_tokens=tokens_per_request)
    request = build_request(PROMPT_IDS, sampling=sampling)
    while True:
        last: float | None = None
        try:
            async for chunk in stub.GenerateStream(request):
                now = time.perf_counter()
                if tally.measuring:
                    tally.tokens += len(chunk.token_ids)
                    tally.chunks += 1
                    if last is not None:
                        tally.gaps.append(now - last)
                last = now
        except grpc.aio.AioRpcError:
            if tally.measuring:
                tally.errors += 1
            await asyncio.sleep(0.01)  # a failing router must not spin this loop


async def _client(
    target: str, streams: int, tokens_per_request: int, start: Barrier, duration: float
) -> ClientTally:
    """`streams` client streams, warmed up, then counted for `duration` seconds from the moment
    every client process and the parent have passed `start`."""
    channels = [
        grpc.aio.insecure_channel(target) for _ in range(-(-streams // STREAMS_PER_CHANNEL))
    ]
    tally = ClientTally()
    stubs = [generation_pb2_grpc.GenerationStub(channel) for channel in channels]
    loops = [
        asyncio.create_task(_stream_loop(stubs[i % len(stubs)], tokens_per_request, tally))
        for i in range(streams)
    ]
    try:
        await asyncio.sleep(WARMUP_S)
        await asyncio.to_thread(start.wait)
        tally.measuring = True
        await asyncio.sleep(duration)
        tally.measuring = False
    finally:
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for channel in channels:
            await channel.close()
    return tally


def _client_process(
    target: str,
    streams: int,
    tokens_per_request: int,
    start: Barrier,
    duration: float,
    results: multiprocessing.Queue[ClientTally],
) -> None:
    """One client process's share (a spawned process)."""
    results.put(asyncio.run(_client(target, streams, tokens_per_request, start, duration)))


def measure(
    target: str,
    router_pid: int,
    relay: str,
    concurrency: int,
    duration: float,
    tokens_per_request: int,
    clients: int,
    step_ms: float = 0.0,
) -> CapacityRow:
    """`concurrency` streams through the router at `target`, spread over `clients` processes
    (one Python client process cannot read tokens as fast as a router relays them), counted
    for `duration` seconds once every process has warmed up (a barrier starts the window)."""
    shares = [concurrency // clients + (i < concurrency % clients) for i in range(clients)]
    shares = [share for share in shares if share]
    spawn = multiprocessing.get_context("spawn")
    start = spawn.Barrier(len(shares) + 1)
    results: multiprocessing.Queue[ClientTally] = spawn.Queue()
    processes = [
        spawn.Process(
            target=_client_process,
            args=(target, share, tokens_per_request, start, duration, results),
        )
        for share in shares
    ]
    for process in processes:
        process.start()
    start.wait(timeout=CLIENT_START_TIMEOUT_S)
    cpu_before, started = router_cpu_seconds(router_pid), time.perf_counter()
    time.sleep(duration)
    cpu, wall = router_cpu_seconds(router_pid) - cpu_before, time.perf_counter() - started
    tallies = [results.get(timeout=CLIENT_START_TIMEOUT_S) for _ in processes]
    for process in processes:
        process.join()
    tokens = sum(t.tokens for t in tallies)
    gaps = [gap for t in tallies for gap in t.gaps] or [0.0]
    return CapacityRow(
        relay=relay,
        concurrency=concurrency,
        tokens_per_s=round(tokens / wall, 1),
        router_cpu=round(cpu / wall, 3),
        tokens_per_router_cpu_s=round(tokens / cpu, 1) if cpu > 0 else 0.0,
        gap_p50_ms=round(percentile(gaps, 50) * 1e3, 3),
        gap_p99_ms=round(percentile(gaps, 99) * 1e3, 3),
        errors=sum(t.errors for t in tallies),
        step_ms=step_ms,
        tokens_per_chunk=round(tokens / max(sum(t.chunks for t in tallies), 1), 2),
    )


def default_clients(others: set[int]) -> int:
    """Client processes: every core but the router's, less one for the fakes (at least one)."""
    return max(1, len(others) - 1)


def pinned(core: int | None) -> Callable[[], None] | None:
    """A Popen `preexec_fn` that pins the child to `core` (None: no core to spare)."""
    if core is None:
        return None
    return lambda: os.sched_setaffinity(0, {core})


def format_rows(rows: Sequence[CapacityRow], as_json: bool) -> str:
    if as_json:
        return "\n".join(json.dumps(asdict(row)) for row in rows)
    header = (
        f"{'relay':<13}{'conc':>6}{'tokens/s':>11}{'router cpu':>11}{'tok/cpu-s':>11}"
        f"{'gap p50 ms':>11}{'gap p99 ms':>11}{'errors':>7}{'step ms':>8}{'tok/msg':>8}"
    )
    lines = [header]
    for row in rows:
        lines.append(
            f"{row.relay:<13}{row.concurrency:>6}{row.tokens_per_s:>11.1f}{row.router_cpu:>11.3f}"
            f"{row.tokens_per_router_cpu_s:>11.1f}{row.gap_p50_ms:>11.3f}{row.gap_p99_ms:>11.3f}"
            f"{row.errors:>7}{row.step_ms:>8.1f}{row.tokens_per_chunk:>8.2f}"
        )
    return "\n".join(lines)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
