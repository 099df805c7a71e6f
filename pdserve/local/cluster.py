"""Starts router + prefill + decode worker processes on 127.0.0.1 (for `pdserve up` and tests).

Ports are derived from one base so several clusters can run side by side: router `base`, its
OpenAI HTTP door `base + 1` (unless set), prefill i `base + 10 + i`, decode i `base + 20 + i`;
metrics the same offsets from `metrics_base`. Further router replicas over the same workers (as
the chart runs them) serve at `base + 2r` (HTTP `+ 1`), r = 1 .. 4.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from pdserve.local.cpu_limit import CpuGroup

HOST = "127.0.0.1"
MAX_ROUTERS = 5  # router replicas fit below the prefill ports: base, base + 2, .. base + 8
LOG_TAIL_LINES = 30  # what an exited process's error quotes of its log
READINESS = {
    "router": "pdserve.v1.Generation",
    "prefill": "pdserve.v1.Prefill",
    "decode": "pdserve.v1.Decode",
}


@dataclass(frozen=True)
class CpuPin:
    """Runs one process on these CPUs only, with as many torch threads (same-budget benchmarks)."""

    role: str  # router | prefill | decode
    index: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class ClusterTls:
    """TLS on every port and mTLS from the router to the workers (docs/security.md); PEM files."""

    ca: Path  # signed both certificates
    server_cert: Path  # every process serves with it: its SANs must cover 127.0.0.1
    server_key: Path
    router_cert: Path  # the router's client identity towards the workers
    router_key: Path
    router_name: str  # a name on router_cert: the only client the workers admit
    # The router's public doors (gRPC and HTTP) demand a client certificate signed by `ca` too.
    clients_need_certificates: bool = False

    def args(self, role: str) -> list[str]:
        served = ["--tls-cert", str(self.server_cert), "--tls-key", str(self.server_key)]
        if role == "router":
            client = ["--worker-tls-cert", str(self.router_cert), "--worker-tls-key"]
            public = ["--tls-client-ca", str(self.ca)] if self.clients_need_certificates else []
            workers = ["--worker-tls-ca", str(self.ca), *client, str(self.router_key)]
            return [*served, *public, *workers]
        admitted = ["--tls-client-ca", str(self.ca), "--tls-allowed-clients", self.router_name]
        return [*served, *admitted]

    def channel(self, address: str) -> grpc.Channel:
        """A blocking channel as the router: its client certificate, the CA's trust."""
        credentials = grpc.ssl_channel_credentials(
            self.ca.read_bytes(), self.router_key.read_bytes(), self.router_cert.read_bytes()
        )
        return grpc.secure_channel(address, credentials)


@dataclass(frozen=True)
class ClusterSpec:
    model_dir: Path
    num_prefill: int = 1
    num_decode: int = 1
    base_port: int = 50051
    metrics_base_port: int = 9100
    worker_args: tuple[str, ...] = ()  # engine flags passed to every worker
    prefill_args: tuple[str, ...] = ()  # after worker_args, prefill workers only (tier overrides)
    decode_args: tuple[str, ...] = ()  # after worker_args, decode workers only (--speculative)
    router_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # extra environment (UCX_* for tests)
    drain_grace_seconds: float = 10.0
    pins: tuple[CpuPin, ...] = ()  # processes not named here run on every CPU
    tls: ClusterTls | None = None  # None: plaintext, as `pdserve up` runs
    http_port: int | None = None  # the router's --http-port: None = base_port + 1, 0 = off
    num_routers: int = 1  # replicas over the same workers: `router` is the first

    def __post_init__(self) -> None:
        if not 1 <= self.num_routers <= MAX_ROUTERS:
            raise ValueError(f"num_routers must be 1 .. {MAX_ROUTERS}, got {self.num_routers}")

    @property
    def router_http_port(self) -> int:
        return self.base_port + 1 if self.http_port is None else self.http_port

    def replica_http_port(self, index: int) -> int:
        """Router replica `index`'s --http-port (0: off, as the first's)."""
        return 0 if self.router_http_port == 0 else self.router_http_port + 2 * index


@dataclass(frozen=True)
class Process:
    role: str
    index: int
    port: int
    metrics_port: int
    popen: subprocess.Popen[bytes] = field(compare=False)
    host: str = HOST  # its own pod's address under `pdserve up --netns`
    log: Path | None = None  # its output, where the cluster keeps logs

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    def exited(self) -> RuntimeError:
        """The error for a process that stopped on its own: its exit code and the end of its log,
        so a failure on a machine whose logs are gone (CI) says why."""
        message = f"{self.name} exited ({self.popen.returncode})"
        if self.log is None or not self.log.exists():
            return RuntimeError(message)
        tail = self.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        return RuntimeError("\n".join([f"{message}; the end of its log:", *tail]))


class Cluster:
    def __init__(self, spec: ClusterSpec, log_dir: Path | None = None) -> None:
        self.spec = spec
        self.log_dir = log_dir
        self.processes: list[Process] = []

    @property
    def router(self) -> Process:
        return self._role("router")[0]

    @property
    def routers(self) -> list[Process]:
        return self._role("router")

    @property
    def prefill(self) -> list[Process]:
        return self._role("prefill")

    @property
    def decode(self) -> list[Process]:
        return self._role("decode")

    @property
    def http_url(self) -> str:
        """The router's OpenAI HTTP door, e.g. `http://127.0.0.1:50052` (add `/v1`)."""
        return f"http://{HOST}:{self.spec.router_http_port}"

    def _role(self, role: str) -> list[Process]:
        return [p for p in self.processes if p.role == role]

    def start(self) -> None:
        spec = self.spec
        for index in range(spec.num_prefill):
            self._spawn("prefill", index, 10 + index, [*spec.worker_args, *spec.prefill_args])
        for index in range(spec.num_decode):
            self._spawn("decode", index, 20 + index, [*spec.worker_args, *spec.decode_args])
        workers = {
            role: ",".join(p.address for p in self._role(role)) for role in ("prefill", "decode")
        }
        router_args = ["--prefill", workers["prefill"], "--decode", workers["decode"]]
        for index in range(spec.num_routers):
            http = ["--http-port", str(spec.replica_http_port(index))]
            self._spawn("router", index, 2 * index, [*router_args, *http, *spec.router_args])

    def _spawn(self, role: str, index: int, offset: int, extra: list[str]) -> None:
        spec = self.spec
        port, metrics_port = spec.base_port + offset, spec.metrics_base_port + offset
        launch = Launch(role, index, HOST, port, metrics_port, tuple(extra))
        self.processes.append(spawn(spec, launch, self.log_dir))

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Blocks until every process reports SERVING on its readiness name and the router
        counts every worker healthy."""
        deadline = time.monotonic() + timeout_s
        wait_ready(self.processes, self.spec.tls, timeout_s)
        healthy = {"prefill": self.spec.num_prefill, "decode": self.spec.num_decode}
        for router in self.routers:
            wait_router_sees(router, healthy, deadline - time.monotonic())

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM everyone (graceful drain), then SIGKILL whoever is left."""
        stop_processes(self.processes, timeout_s)

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Launch:
    """One process to start: its role, where it serves, its flags beyond the shared ones."""

    role: str  # router | prefill | decode
    index: int
    host: str
    port: int
    metrics_port: int
    extra: tuple[str, ...]
    prefix: tuple[str, ...] = ()  # what runs it (`ip netns exec NS` for a pod)
    env: tuple[tuple[str, str], ...] = ()  # after the spec's
    cpu_group: CpuGroup | None = None  # its pod's CPU quota (`pdserve up --pod-cpus`)


# Flags naming a folder that must be a worker's own: each worker gets a subfolder named after it
# (stable across its restarts, so a restarted worker finds what it left there).
WORKER_FOLDER_FLAGS = ("--kv-offload-disk-path",)


def worker_folders(args: tuple[str, ...], worker: str) -> list[str]:
    """`args` with each WORKER_FOLDER_FLAGS value turned into its subfolder `worker`."""
    out = list(args)
    for index, arg in enumerate(out):
        flag, equals, value = arg.partition("=")
        if flag in WORKER_FOLDER_FLAGS and equals and value:
            out[index] = f"{flag}={Path(value) / worker}"
        elif arg in WORKER_FOLDER_FLAGS and index + 1 < len(out) and out[index + 1]:
            out[index + 1] = str(Path(out[index + 1]) / worker)
    return out


def spawn(spec: ClusterSpec, launch: Launch, log_dir: Path | None) -> Process:
    """Starts `pdserve ROLE` as `launch` says, its output in `log_dir/ROLE-INDEX.log`."""
    role, index = launch.role, launch.index
    command = [
        *launch.prefix,
        sys.executable,
        "-m",
        "pdserve",
        role,
        "--host",
        launch.host,
        "--port",
        str(launch.port),
        "--metrics-port",
        str(launch.metrics_port),
        "--model",
        str(spec.model_dir),
        "--drain-grace-seconds",
        str(spec.drain_grace_seconds),
        *(spec.tls.args(role) if spec.tls is not None else []),
        *worker_folders(launch.extra, f"{role}-{index}"),
    ]
    output: int | BinaryIO = subprocess.DEVNULL
    log = None if log_dir is None else log_dir / f"{role}-{index}.log"
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        output = open(log, "wb")  # noqa: SIM115 (lives with the child)
    env = {**os.environ, **dict(spec.env), **dict(launch.env)}
    cpus = next((p.cpus for p in spec.pins if (p.role, p.index) == (role, index)), None)
    if cpus is not None:
        env["OMP_NUM_THREADS"] = str(len(cpus))  # torch's intra-op threads = pinned CPUs
    if launch.cpu_group is not None:
        env["OMP_NUM_THREADS"] = str(launch.cpu_group.torch_threads)  # as many as its quota
    popen = subprocess.Popen(
        command,
        stdout=output,
        stderr=subprocess.STDOUT,
        env=env,
        # In the child before exec, so every thread the worker ever starts inherits the mask
        # and the quota.
        preexec_fn=None
        if cpus is None and launch.cpu_group is None
        else functools.partial(_confine, cpus, launch.cpu_group),
    )
    return Process(role, index, launch.port, launch.metrics_port, popen, launch.host, log)


def _confine(cpus: tuple[int, ...] | None, cpu_group: CpuGroup | None) -> None:
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    if cpu_group is not None:
        cpu_group.join()


def stop_processes(processes: list[Process], timeout_s: float) -> None:
    """SIGTERM every process (graceful drain), then SIGKILL whoever is left after `timeout_s`."""
    for process in processes:
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait()


def wait_ready(processes: list[Process], tls: ClusterTls | None, timeout_s: float) -> None:
    """Blocks until every process reports SERVING on its readiness name."""
    deadline = time.monotonic() + timeout_s
    for process in processes:
        while not is_ready(process, tls):
            if process.popen.poll() is not None:
                raise process.exited()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{process.name} not ready in {timeout_s:.0f}s")
            time.sleep(0.2)


def wait_router_sees(router: Process, healthy: Mapping[str, int], timeout_s: float) -> None:
    """Blocks until the router counts `healthy[tier]` healthy workers in each tier. The router is
    ready once one worker of each tier answers its Load poll; a run started then would send
    every request to the first worker polled."""
    deadline = time.monotonic() + timeout_s
    while not _counts_match(router_healthy_workers(router), healthy):
        if router.popen.poll() is not None:
            raise router.exited()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the router does not see {dict(healthy)} healthy workers")
        time.sleep(0.2)


def _counts_match(seen: Mapping[str, int], wanted: Mapping[str, int]) -> bool:
    return all(seen.get(tier, 0) == count for tier, count in wanted.items())


def router_healthy_workers(router: Process) -> dict[str, int]:
    """The router's `pdserve_router_workers{state="healthy"}` per tier, from its /metrics."""
    url = f"http://{router.host}:{router.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as page:
        text = page.read().decode()
    return {
        sample.labels["tier"]: int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "pdserve_router_workers"
        for sample in family.samples
        if sample.labels.get("state") == "healthy"
    }


def is_ready(process: Process, tls: ClusterTls | None) -> bool:
    """Whether `process` answers SERVING on its readiness name now (one check, 1 s at most)."""
    address = process.address
    channel = grpc.insecure_channel(address) if tls is None else tls.channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=READINESS[process.role]), timeout=1
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
