"""KV transfer over UCX vs ucx_perftest vs gRPC, side by side in one run.

    .venv/bin/pdserve bench transfer [--iterations 20] [--transports sm,tcp]

For each prompt size (default model layout: 30 layers, 3 KV heads, head_dim 64, block 16, float32)
and transport it measures, in separate processes:
- `ucx_perftest -t tag_bw` at the same message size and UCX_TLS (the ceiling for one UCX message);
- pdserve's KVSender -> KVReceiver: send_whole() called on prefill -> poll() answers DONE on decode
  (gather + wire + scatter), timed with CLOCK_MONOTONIC, which both processes share; the wire part
  alone (send posted after the gather -> receive seen complete before the scatter) is the figure
  comparable with perftest;
- the same blocks as one unary gRPC message (gather, bytes, gRPC over loopback, scatter on the
  server), the way the KV would travel if it went inside protobuf.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import statistics
import subprocess
import time
from concurrent import futures
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from pdserve.core.kv.cache import KVCache, KVLayout
from pdserve.core.transfer.staging import Staging, block_index
from pdserve.local.ports import free_port

LAYOUT = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype="float32")
NUM_BLOCKS = 160
TRANSPORTS = {"sm": "sm,self", "tcp": "tcp"}
GRPC_METHOD = "/pdserve.bench.Kv/Push"
GRPC_MAX_BYTES = 512 * 2**20
POLL_S = 0.0001
WARMUP = 3


@dataclass(frozen=True)
class Case:
    prompt_tokens: int

    @property
    def num_blocks(self) -> int:
        return -(-self.prompt_tokens // int(LAYOUT.block_size))

    @property
    def nbytes(self) -> int:
        return self.num_blocks * int(LAYOUT.block_nbytes)

    def blocks(self, seed: int) -> list[int]:
        order = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed))
        return [int(b) for b in order[: self.num_blocks]]


def _ucx_env(tls: str) -> dict[str, str]:
    return {"UCX_TLS": tls, "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}


def _filled_cache(seed: int) -> KVCache:
    cache = KVCache(LAYOUT, NUM_BLOCKS, "cpu")
    cache.tensor.copy_(
        torch.randn(cache.tensor.shape, generator=torch.Generator().manual_seed(seed))
    )
    return cache


def _peer(conn: Connection, role: str, env: dict[str, str], polling: bool) -> None:
    """A prefill or decode process: answers ("expect"|"wait"|"send", args) until "stop"."""
    os.environ.update(env)
    from pdserve.core.transfer.interface import send_whole
    from pdserve.core.transfer.ucx import KVReceiver
    from pdserve.core.transfer.ucx_runtime import UcxConfig
    from pdserve.core.transfer.ucx_sender import KVSender

    cache = _filled_cache(seed=1 if role == "prefill" else 2)
    config = UcxConfig(progress_polling=polling)
    peer = KVReceiver(cache, config) if role == "decode" else KVSender(config)
    conn.send(peer.address() if isinstance(peer, KVReceiver) else b"")
    while (message := conn.recv())[0] != "stop":
        name, args = message
        if isinstance(peer, KVReceiver) and name == "expect":
            conn.send(peer.expect(*args))
        elif isinstance(peer, KVReceiver) and name == "wait":
            conn.send(_wait_done(peer, args[0]))
        elif isinstance(peer, KVSender) and name == "send":
            started = time.perf_counter()
            conn.send((started, send_whole(peer, args[0], cache, args[1], args[2]).result()))
    peer.close()


def _wait_done(receiver: Any, request_id: str) -> tuple[float, float]:
    """(moment DONE was seen, seconds the landing poll took = the scatter)."""
    while True:
        started = time.perf_counter()
        if receiver.poll(request_id).value != "pending":
            finished = time.perf_counter()
            receiver.cancel(request_id)
            return finished, finished - started
        time.sleep(POLL_S)


def _median_gbps(nbytes: int, seconds: list[float]) -> float:
    return nbytes / statistics.median(seconds) / 1e9


def bench_ucx(
    tls: str, cases: list[Case], iterations: int, polling: bool
) -> dict[int, dict[str, float]]:
    context = multiprocessing.get_context("spawn")
    conns, processes = [], []
    for role in ("decode", "prefill"):
        parent, child = context.Pipe()
        process = context.Process(
            target=_peer, args=(child, role, _ucx_env(tls), polling), daemon=True
        )
        process.start()
        conns.append(parent)
        processes.append(process)
    decode, prefill = conns
    try:
        decode.recv(), prefill.recv()
        rows = {}
        for case in cases:  # perftest just before and just after: the box is shared and noisy
            before = bench_perftest(tls, case.nbytes, iterations)
            rows[case.prompt_tokens] = _ucx_case(decode, prefill, case, iterations)
            after = bench_perftest(tls, case.nbytes, iterations)
            rows[case.prompt_tokens]["perftest_gbps"] = (before + after) / 2
        return rows
    finally:
        for conn, process in reversed(list(zip(conns, processes, strict=True))):  # prefill first
            if process.is_alive():
                conn.send(("stop", ()))
            process.join(timeout=20)
            if process.is_alive():
                process.kill()


def _ucx_case(decode: Connection, prefill: Connection, case: Case, n: int) -> dict[str, float]:
    total, wire, gather, scatter = [], [], [], []
    for i in range(WARMUP + n):
        request_id = f"{case.prompt_tokens}-{i}"
        decode.send(("expect", (request_id, case.blocks(seed=2 * i), LAYOUT)))
        descriptor = decode.recv()
        decode.send(("wait", (request_id,)))
        prefill.send(("send", (descriptor, case.blocks(seed=2 * i + 1), case.prompt_tokens)))
        started, result = prefill.recv()
        done, scatter_s = decode.recv()
        if i >= WARMUP:
            total.append(done - started)
            # posted on prefill (after the gather) -> seen complete on decode (before the scatter)
            wire.append(done - scatter_s - started - result.gather_seconds)
            gather.append(result.gather_seconds)
            scatter.append(scatter_s)
    return {
        "total_ms": statistics.median(total) * 1e3,
        "total_gbps": _median_gbps(case.nbytes, total),
        "wire_gbps": _median_gbps(case.nbytes, wire),
        "gather_ms": statistics.median(gather) * 1e3,
        "scatter_ms": statistics.median(scatter) * 1e3,
    }


def bench_perftest(tls: str, nbytes: int, iterations: int) -> float:
    """GB/s (1e9) of `ucx_perftest -t tag_bw` between two processes."""
    spec = importlib.util.find_spec("libucx")
    assert spec is not None and spec.submodule_search_locations is not None
    root = Path(spec.submodule_search_locations[0])
    env = {**os.environ, **_ucx_env(tls), "LD_LIBRARY_PATH": str(root / "lib")}
    port = str(free_port())
    flags = ["-t", "tag_bw", "-s", str(nbytes), "-n", str(iterations), "-w", str(WARMUP)]
    binary = str(root / "bin" / "ucx_perftest")
    server = subprocess.Popen([binary, "-p", port, *flags], env=env, stdout=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        out = subprocess.run(
            [binary, "127.0.0.1", "-p", port, *flags],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    finally:
        server.wait(timeout=30)
    final = next(line for line in out.splitlines() if line.startswith("Final:"))
    return float(final.split()[6]) * 2**20 / 1e9  # perftest's MB/s is MiB/s


def _grpc_server(conn: Connection, port: int) -> None:
    cache = _filled_cache(seed=2)
    state: dict[str, Any] = {}

    def push(request: bytes, context: grpc.ServicerContext) -> bytes:
        piece = state["piece"]
        piece.raw.numpy()[:] = np.frombuffer(request, dtype=np.uint8)
        piece.scatter_into(cache, state["blocks"])
        return b""

    def prepare(request: bytes, context: grpc.ServicerContext) -> bytes:
        num_blocks = int(request)
        state["piece"] = Staging(LAYOUT, num_blocks).pieces[0]
        state["blocks"] = block_index(cache, list(range(num_blocks)))
        return b""

    handler = grpc.method_handlers_generic_handler(
        "pdserve.bench.Kv",
        {
            "Push": grpc.unary_unary_rpc_method_handler(push),
            "Prepare": grpc.unary_unary_rpc_method_handler(prepare),
        },
    )
    options = [("grpc.max_receive_message_length", GRPC_MAX_BYTES)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=options)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    conn.send("ready")
    conn.recv()
    server.stop(grace=None)


def bench_grpc(cases: list[Case], iterations: int) -> dict[int, float]:
    """Median seconds: gather, one unary gRPC call carrying the bytes, scatter on the server."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    port = free_port()
    process = context.Process(target=_grpc_server, args=(child, port), daemon=True)
    process.start()
    parent.recv()
    cache = _filled_cache(seed=1)
    options = [("grpc.max_send_message_length", GRPC_MAX_BYTES)]
    results = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        push: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(GRPC_METHOD)
        prepare: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/pdserve.bench.Kv/Prepare"
        )
        for case in cases:
            prepare(str(case.num_blocks).encode())
            seconds = []
            piece = Staging(LAYOUT, case.num_blocks).pieces[0]  # reused, as KVSender's pool does
            for i in range(WARMUP + iterations):
                started = time.perf_counter()
                piece.gather_from(cache, block_index(cache, case.blocks(seed=i)), bytes(16))
                push(piece.raw.numpy().tobytes())
                seconds.append(time.perf_counter() - started)
            results[case.prompt_tokens] = statistics.median(seconds[WARMUP:])
    parent.send("stop")
    process.join(timeout=20)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--transports", default="sm,tcp")
    parser.add_argument("--prompt-tokens", default="100,1000")
    parser.add_argument(
        "--progress-polling", action="store_true", help="UcxConfig.progress_polling"
    )


def run(args: argparse.Namespace) -> int:
    cases = [Case(int(n)) for n in args.prompt_tokens.split(",")]
    grpc_s = bench_grpc(cases, args.iterations)
    print(f"layout {LAYOUT}, block {LAYOUT.block_nbytes} B, median of {args.iterations}")
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()} (a shared box skews every row)")
    print(
        "transport tokens    MB | perftest  wire  ratio "
        "| KV e2e ms  GB/s gather scatter | gRPC ms  GB/s | UCX/gRPC"
    )
    for transport in args.transports.split(","):
        ucx = bench_ucx(TRANSPORTS[transport], cases, args.iterations, args.progress_polling)
        for case in cases:
            row, g = ucx[case.prompt_tokens], grpc_s[case.prompt_tokens]
            perf = row["perftest_gbps"]
            print(
                f"{transport:9} {case.prompt_tokens:6} {case.nbytes / 1e6:5.1f} | "
                f"{perf:8.2f} {row['wire_gbps']:5.2f} {row['wire_gbps'] / perf:5.0%} | "
                f"{row['total_ms']:9.2f} {row['total_gbps']:5.2f} {row['gather_ms']:6.2f} "
                f"{row['scatter_ms']:7.2f} | {g * 1e3:7.2f} {case.nbytes / g / 1e9:5.2f} | "
                f"{g * 1e3 / row['total_ms']:7.1f}x"
            )
    return 0
