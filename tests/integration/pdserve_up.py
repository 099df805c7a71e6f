"""`pdserve up` as a user starts it (the README's main command), in its own process on free
ports, stopped with Ctrl-C (SIGINT). Shared by the tests that load it from outside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.local.ports import free_port_bases

from .conftest import UCX_ENV, WORKER_ARGS


class PdserveUp:
    """One `pdserve up` process: router on `port`, its OpenAI HTTP door on `port + 1`."""

    def __init__(self, model_dir: Path, log_dir: Path) -> None:
        self.port, metrics_port = free_port_bases(2)
        command = [
            sys.executable,
            "-m",
            "pdserve",
            "up",
            "--model",
            str(model_dir),
            "--port",
            str(self.port),
            "--metrics-port",
            str(metrics_port),
            "--http-port",
            str(self.port + 1),
            "--log-dir",
            str(log_dir),
            "--",
            *WORKER_ARGS,
        ]
        env = {**os.environ, **dict(UCX_ENV)}
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port + 1}/v1"

    def wait_ready(self, timeout_s: float = 300) -> None:
        """Until the router reports SERVING (it does once its workers are ready)."""
        deadline = time.monotonic() + timeout_s
        request = health_pb2.HealthCheckRequest(service="pdserve.v1.Generation")
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "pdserve up exited early"
            with grpc.insecure_channel(self.address) as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
            time.sleep(0.5)
        raise TimeoutError("pdserve up: router not ready")

    def stop(self) -> tuple[int, str]:
        """Ctrl-C, then the exit code and the tail of what it printed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        output, _ = self.process.communicate(timeout=60)
        return self.process.returncode, output.decode(errors="replace")[-3000:]
