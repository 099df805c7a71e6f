"""The README's main command (`pdserve up`) under the project's load runner, then Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .conftest import UCX_ENV, WORKER_ARGS, free_port_base

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _wait_router_ready(address: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    request = health_pb2.HealthCheckRequest(service="pdserve.v1.Generation")
    while time.monotonic() < deadline:
        assert process.poll() is None, "pdserve up exited early"
        with grpc.insecure_channel(address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
        time.sleep(0.5)
    raise TimeoutError("pdserve up: router not ready")


def test_loadtest_runner_against_pdserve_up(model_dir: Path, tmp_path: Path) -> None:
    port, metrics_port = free_port_base(), free_port_base()
    command = [
        sys.executable,
        "-m",
        "pdserve",
        "up",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--http-port",
        str(port + 1),
        "--log-dir",
        str(tmp_path / "logs"),
        "--",
        *WORKER_ARGS,
    ]
    up = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_router_ready(f"127.0.0.1:{port}", up, timeout_s=300)
        report_path = tmp_path / "report.json"
        runner = [
            sys.executable,
            "-m",
            "pdserve",
            "loadtest",
            str(REPO / "loadtest" / "stream_concurrency.json"),
            "--host",
            f"127.0.0.1:{port}",
            "-c",
            "4",
            "-n",
            "12",
            "-q",
            "--output",
            str(report_path),
        ]
        load = subprocess.run(runner, capture_output=True, text=True, timeout=300)
        assert load.returncode == 0, load.stderr
        report = json.loads(report_path.read_text())
        assert report["count"] == 12
        assert report["statusCodeDistribution"] == {"OK": 12}
        assert not report["errorDistribution"]
        assert report["generation"]["outputTokens"] == 12 * 32  # ignore_eos, max_tokens 32
        _chat_as_readme_shows(f"http://127.0.0.1:{port + 1}/v1")
    finally:
        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=60)
    assert up.returncode == 0, output.decode(errors="replace")[-3000:]


def _chat_as_readme_shows(base_url: str) -> None:
    """README's `openai` example against `pdserve up`'s HTTP door."""
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(
            model="smollm2-135m-instruct",
            max_tokens=8,
            stream=True,
            messages=[{"role": "user", "content": "Tell me about Paris"}],
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text.strip()


def _env() -> dict[str, str]:
    return {**os.environ, **dict(UCX_ENV)}
