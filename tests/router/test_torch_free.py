"""The router imports no torch: its doors, the protocol helpers it shares with the workers, and a
real `pdserve router` process that tokenizes and renders a chat template.

Each check runs in a fresh interpreter: this test process has long since imported torch.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.client import GenerationClient, build_request
from pdserve.local.ports import free_port
from pdserve.testing.fake_tiers import fake_tiers
from pdserve.v1 import common_pb2

# The router's two doors, and what they share with the workers (one place each).
TORCH_FREE_MODULES = (
    "pdserve.router.main",
    "pdserve.router.http.app",
    "pdserve.core.config",
    "pdserve.core.sampling_params",
    "pdserve.core.text.tokenizer",
    "pdserve.core.text.chat",
    "pdserve.core.serving.cli_config",
    "pdserve.core.serving.request_guard",
    "pdserve.core.serving.sampling_proto",
    "pdserve.core.serving.server",
    "pdserve.core.serving.tls",
)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize("module", TORCH_FREE_MODULES)
def test_module_imports_no_torch(module: str) -> None:
    result = run_python(f"import {module}, sys; assert 'torch' not in sys.modules")
    assert result.returncode == 0, result.stderr[-2000:]


def test_loading_the_tokenizer_and_rendering_a_chat_imports_no_torch(model_dir: Path) -> None:
    code = f"""
import sys
from pathlib import Path
from pdserve.core.text.chat import ChatMessage, chat_prompt
from pdserve.router.config import RequestCaps
from pdserve.router.validation import load_validator

validator = load_validator(Path({str(model_dir)!r}), RequestCaps())
prompt = chat_prompt(validator.tokenizer, [ChatMessage("user", "Hi")])
assert validator.tokenizer.encode(prompt), prompt
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]


async def _wait_ready(target: str, router: subprocess.Popen[bytes]) -> None:
    request = health_pb2.HealthCheckRequest(service="pdserve.v1.Generation")
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(1200):  # up to 120 s on a busy machine
            assert router.poll() is None, "the router exited"
            try:
                reply = await stub.Check(request, timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"router at {target} not ready")


def _chat_completion(http_port: int, model: str) -> dict[str, object]:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer: dict[str, object] = json.loads(reply.read())
        return answer


def test_a_router_process_serves_both_doors_without_torch(model_dir: Path) -> None:
    """Text prompt over gRPC (tokenized) and a chat over HTTP (template rendered), then the
    process's memory map holds no libtorch."""

    async def body() -> None:
        async with fake_tiers() as tiers:
            port, http_port = free_port(), free_port()
            command = [sys.executable, "-m", "pdserve", "router", "--host", "127.0.0.1"]
            command += ["--port", str(port), "--metrics-port", str(free_port())]
            command += ["--http-port", str(http_port), "--model", str(model_dir)]
            command += ["--prefill", tiers.prefill_addresses[0]]
            command += ["--decode", tiers.decode_addresses[0]]
            router = subprocess.Popen(command)
            try:
                await _wait_ready(f"127.0.0.1:{port}", router)
                async with GenerationClient.connect(f"127.0.0.1:{port}") as client:
                    sampling = common_pb2.SamplingParams(max_tokens=3)
                    reply = await client.generate(build_request("Hello there", sampling=sampling))
                assert len(reply.token_ids) == 3
                answer = await asyncio.to_thread(_chat_completion, http_port, model_dir.name)
                assert answer["object"] == "chat.completion"
                maps = Path(f"/proc/{router.pid}/maps").read_text()
                assert "libtorch" not in maps
            finally:
                router.terminate()
                router.wait(timeout=60)

    asyncio.run(body())
