"""Router overhead: Generate latency through the router vs the same calls straight to the tiers.

    .venv/bin/pdserve bench router [--requests 2000] [--max-tokens 4]
    .venv/bin/pdserve bench router --capacity [--concurrency 16,64,256,1024] [--duration S]
        [--relay multiplexed,per-request] [--json]          (capacity.py: relayed tokens)
    .venv/bin/pdserve bench router --serve-fakes FILE       (the fake tiers, in the foreground)

The tiers are zero-work fakes (`pdserve.testing.fake_tiers`: prefill answers at once, decode streams
max_tokens tokens back to back) in a process of their own; the router is a real `pdserve router`
process; this process is the client. Both paths make the same internal calls (Reserve, Prefill,
Decode.Generate streamed to the end), so the difference is the router alone: one more gRPC hop,
admission and validation (plus tokenization for a text prompt), worker choice and the relay of
each delta. With real tiers, model time would land on both paths alike and bury the router's
share in its noise; this isolates it.

A fourth path, "bare relay", is the floor for any Python gRPC router: a process that makes the
same three calls for each Generate with no validation, choice, retries or metrics. The router
minus the bare relay is what pdserve's own logic costs. Requests go one at a time, and the paths
take turns in rounds so that drift in machine load falls on all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.bench.router.capacity import (
    CapacityRow,
    default_clients,
    format_rows,
    measure,
    pinned,
    split_cores,
    stop,
)

# BareRelay is re-exported: callers (tests/router/test_bench.py) import it from here.
from pdserve.bench.router.servers import BareRelay as BareRelay
from pdserve.bench.router.servers import TierStubs, serve_fakes, serve_relay

# percentile is re-exported: callers (tests/router/test_bench.py) import it from here.
from pdserve.bench.router.stats import percentile as percentile
from pdserve.client import GenerationClient, build_request
from pdserve.local.ports import free_port
from pdserve.router.config import RelayMode
from pdserve.v1 import common_pb2

PROMPT_IDS = list(range(1, 65))  # 64 tokens
PROMPT_TEXT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 4
Timed = Callable[[], Awaitable[None]]


def _start_fakes(workdir: Path, step_ms: float = 0.0) -> tuple[subprocess.Popen[bytes], str, str]:
    address_file = workdir / "fakes.json"
    command = [
        sys.executable,
        "-m",
        "pdserve",
        "bench",
        "router",
        "--serve-fakes",
        str(address_file),
        "--step-ms",
        str(step_ms),
    ]
    process = subprocess.Popen(command)
    for _ in range(600):
        if address_file.exists() and address_file.read_text():
            prefill, decode = json.loads(address_file.read_text())
            return process, prefill, decode
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("fake tiers did not start within 30 s")


def _start_relay(prefill: str, decode: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, "-m", "pdserve", "bench", "router", "--serve-relay", str(port)]
    return subprocess.Popen([*command, prefill, decode]), f"127.0.0.1:{port}"


def _start_router(
    prefill: str,
    decode: str,
    model: str | None,
    extra: Sequence[str] = ("--max-queue", "64"),
    core: int | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "pdserve",
        "router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    command += ["--metrics-port", str(free_port()), "--prefill", prefill, "--decode", decode]
    command += [*extra, "--http-port", "0", *(["--model", model] if model else [])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, env=env, preexec_fn=pinned(core))
    return process, f"127.0.0.1:{port}"


async def _wait_ready(target: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="pdserve.v1.Generation")
        while time.monotonic() < end:
            try:
                reply = await stub.Check(request, timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"router at {target} not ready within {timeout:.0f} s")


def _direct_path(prefill_target: str, decode_target: str, max_tokens: int) -> Timed:
    """The router's calls for one request, made by the client itself."""
    tiers = TierStubs(prefill_target, decode_target)
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens, top_p=1.0)
    counter = iter(range(1 << 62))

    async def once() -> None:
        await tiers.generate(f"direct-{next(counter)}", PROMPT_IDS, sampling)

    return once


def _router_path(client: GenerationClient, prompt: str | list[int], max_tokens: int) -> Timed:
    request = build_request(prompt, sampling=common_pb2.SamplingParams(max_tokens=max_tokens))

    async def once() -> None:
        reply = await client.generate(request)
        if len(reply.token_ids) != max_tokens:
            raise RuntimeError(f"router answered {len(reply.token_ids)} tokens")

    return once


async def _measure(
    paths: dict[str, Timed], requests: int, warmup: int, rounds: int
) -> dict[str, list[float]]:
    for timed in paths.values():
        for _ in range(warmup):
            await timed()
    samples: dict[str, list[float]] = {name: [] for name in paths}
    per_round = max(1, requests // rounds)
    for _ in range(rounds):
        for name, timed in paths.items():
            for _ in range(per_round):
                start = time.perf_counter()
                await timed()
                samples[name].append(time.perf_counter() - start)
    return samples


def report(samples: dict[str, list[float]], baseline: str) -> str:
    base_p50 = percentile(samples[baseline], 50)
    base_p99 = percentile(samples[baseline], 99)
    lines = [
        f"{'path':<22}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}"
    ]
    for name, values in samples.items():
        p50, p99 = percentile(values, 50), percentile(values, 99)
        mean = sum(values) / len(values)
        lines.append(
            f"{name:<22}{len(values):>6}{p50 * 1e3:>9.3f}{p99 * 1e3:>9.3f}{mean * 1e3:>9.3f}"
            f"{(p50 - base_p50) * 1e3:>9.3f}{(p99 - base_p99) * 1e3:>9.3f}"
        )
    return "\n".join(lines)


async def _run(
    args: argparse.Namespace, prefill: str, decode: str, relay: str, router: str
) -> dict[str, list[float]]:
    await _wait_ready(router, timeout=180)
    async with (
        GenerationClient.connect(router) as client,
        GenerationClient.connect(relay) as relay_client,
    ):
        paths = {
            "direct (no router)": _direct_path(prefill, decode, args.max_tokens),
            "bare relay (floor)": _router_path(relay_client, PROMPT_IDS, args.max_tokens),
            "router, token ids": _router_path(client, PROMPT_IDS, args.max_tokens),
            "router, text prompt": _router_path(client, PROMPT_TEXT, args.max_tokens),
        }
        return await _measure(paths, args.requests, args.warmup, args.rounds)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=2000, help="timed requests per path")
    parser.add_argument("--warmup", type=int, default=200, help="untimed requests per path first")
    parser.add_argument("--rounds", type=int, default=100, help="turns the paths take")
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens per request")
    parser.add_argument("--model", default=None, help="model folder (its tokenizer)")
    parser.add_argument("--out", type=Path, default=None, help="also write samples here (JSON)")
    parser.add_argument(
        "--serve-fakes",
        type=Path,
        default=None,
        metavar="FILE",
        help="only serve the zero-work fake prefill and decode tiers (foreground, until SIGTERM); "
        'write ["PREFILL_ADDR", "DECODE_ADDR"] to FILE once they serve',
    )
    capacity = parser.add_argument_group("--capacity: relayed tokens per router CPU-second")
    capacity.add_argument(
        "--capacity", action="store_true", help="measure relay capacity instead of overhead"
    )
    capacity.add_argument(
        "--concurrency",
        type=_int_list,
        default=[16, 64, 256, 1024],
        help="streams, comma-separated",
    )
    capacity.add_argument("--duration", type=float, default=10.0, help="seconds per row")
    capacity.add_argument(
        "--relay",
        type=_relay_list,
        default=["per-request", "multiplexed"],
        help="router relay paths to measure, comma-separated (the router's --relay)",
    )
    capacity.add_argument("--tokens-per-request", type=int, default=256, help="tokens per stream")
    capacity.add_argument(
        "--clients",
        type=int,
        default=0,
        help="client processes (0: every core but the router's, less one for the fakes)",
    )
    capacity.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="the fake decode's engine step, ms: it makes a token per stream each step on its "
        "own clock, steps queued while the router reads go out as one message (0: a step "
        "once the router has read the last one); also with --serve-fakes",
    )
    capacity.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument("--serve-relay", nargs=3, default=None, help=argparse.SUPPRESS)


def _int_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _relay_list(text: str) -> list[str]:
    values = [part for part in text.split(",") if part]
    unknown = set(values) - {mode.value for mode in RelayMode}
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"expected multiplexed and/or per-request, got {text!r}")
    return values


def _capacity(args: argparse.Namespace) -> list[CapacityRow]:
    """Each relay path in turn, against one set of fakes; the router alone on its core."""
    router_core, others = split_cores()
    os.sched_setaffinity(0, others)  # this process and, inherited, the fakes and clients
    clients = args.clients or default_clients(others)
    max_queue = str(2 * max(args.concurrency))
    rows: list[CapacityRow] = []
    with tempfile.TemporaryDirectory() as workdir:
        fakes, prefill, decode = _start_fakes(Path(workdir), args.step_ms)
        try:
            for relay in args.relay:
                extra = ("--max-queue", max_queue, "--relay", relay)
                router, target = _start_router(prefill, decode, args.model, extra, router_core)
                try:
                    asyncio.run(_wait_ready(target, timeout=180))
                    for concurrency in args.concurrency:
                        row = measure(
                            target,
                            router.pid,
                            relay,
                            concurrency,
                            args.duration,
                            args.tokens_per_request,
                            clients,
                            args.step_ms,
                        )
                        rows.append(row)
                        print(format_rows([row], as_json=True), file=sys.stderr, flush=True)
                finally:
                    stop(router)
        finally:
            stop(fakes)
    return rows


def run(args: argparse.Namespace) -> int:
    if args.serve_fakes is not None:
        serve_fakes(args.serve_fakes, args.step_ms / 1e3)
        return 0
    if args.serve_relay is not None:
        port, prefill_target, decode_target = args.serve_relay
        serve_relay(int(port), prefill_target, decode_target)
        return 0
    if args.capacity:
        print(format_rows(_capacity(args), args.json))
        return 0
    with tempfile.TemporaryDirectory() as workdir:
        fakes, prefill, decode = _start_fakes(Path(workdir))
        relay, relay_target = _start_relay(prefill, decode)
        router, target = _start_router(prefill, decode, args.model)
        try:
            samples = asyncio.run(_run(args, prefill, decode, relay_target, target))
        finally:
            for process in (router, relay, fakes):
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    print(f"router overhead, {args.max_tokens} tokens/request, one request at a time, fake tiers")
    print(report(samples, baseline="direct (no router)"))
    if args.out is not None:
        args.out.write_text(json.dumps(samples))
    return 0
