"""Router start-up time and resident memory.

    pdserve bench router-footprint [--runs 5] [--model DIR]

Starts zero-work fake tiers (`pdserve bench router --serve-fakes`) once, then a real
`pdserve router` process (gRPC and HTTP doors on) `--runs` times, one after another. Each run
reports the seconds from just before the process is spawned to its readiness (gRPC health
`pdserve.v1.Generation` SERVING: tokenizer loaded, both tiers answered Load), the process's
resident memory then (VmRSS) and its peak (VmHWM), and whether libtorch is mapped into it.
The fakes answer at once, so the figures are the router's alone.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.core.model.source import resolve_model
from pdserve.local.ports import free_port

READY_SERVICE = "pdserve.v1.Generation"


def start_fakes(address_file: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    command = [sys.executable, "-m", "pdserve", "bench", "router", "--serve-fakes"]
    process = subprocess.Popen([*command, str(address_file)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if address_file.exists() and address_file.read_text():
            prefill, decode = json.loads(address_file.read_text())
            return process, prefill, decode
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("fake tiers did not start within 60 s")


def wait_ready(target: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    request = health_pb2.HealthCheckRequest(service=READY_SERVICE)
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"router exited with {process.returncode} before ready")
            try:
                reply = stub.Check(request, timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.02)
    raise RuntimeError(f"router at {target} not ready within {timeout:.0f} s")


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a live process, in KiB (Linux /proc)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@dataclass(frozen=True)
class Figures:
    ready_s: float
    rss_mib: float
    peak_rss_mib: float
    libtorch_mapped: bool


def one_run(prefill: str, decode: str, model: Path) -> Figures:
    port = free_port()
    command = [sys.executable, "-m", "pdserve", "router", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--metrics-port", str(free_port())]
    command += ["--http-port", str(free_port()), "--prefill", prefill, "--decode", decode]
    command += ["--model", str(model)]
    start = time.monotonic()
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"127.0.0.1:{port}", process, timeout=300)
        ready_s = time.monotonic() - start
        memory = memory_kib(process.pid)
        torch_mapped = maps_torch(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    return Figures(
        ready_s=round(ready_s, 3),
        rss_mib=round(memory["VmRSS"] / 1024, 1),
        peak_rss_mib=round(memory["VmHWM"] / 1024, 1),
        libtorch_mapped=torch_mapped,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="router starts, one after another")
    parser.add_argument("--model", type=Path, default=None, help="model folder (its tokenizer)")


def run(args: argparse.Namespace) -> int:
    model = resolve_model(args.model)
    with tempfile.TemporaryDirectory() as workdir:
        fakes, prefill, decode = start_fakes(Path(workdir) / "fakes.json")
        try:
            runs = [one_run(prefill, decode, model) for _ in range(args.runs)]
        finally:
            fakes.send_signal(signal.SIGTERM)
            fakes.wait(timeout=60)
    for run in runs:
        print(json.dumps(asdict(run)))
    for key in ("ready_s", "rss_mib", "peak_rss_mib"):
        values = [getattr(run, key) for run in runs]
        print(f"{key}: median {statistics.median(values)}, min {min(values)}, max {max(values)}")
    return 0
