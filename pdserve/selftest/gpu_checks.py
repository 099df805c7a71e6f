"""The checks of `pdserve selftest --gpu`, each returning a `CheckResult` (never raising).

Every check needs CUDA; without it each is SKIPPED with the reason, so the report still says what
was not verified. The pytest-based checks run from a source checkout (they need tests/).
"""

from __future__ import annotations

import enum
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pdserve.core.forward_batch import DecodeMetadata, ForwardBatch
from pdserve.core.kv.cache import KVCache, KVLayout
from pdserve.core.llm import LLM
from pdserve.core.model.config import ModelConfig
from pdserve.core.model.forward import CausalLM

TESTS_DIR = Path("tests")
UP_READY_LINE = "pdserve generate"  # what `pdserve up` prints once every tier serves
UP_TIMEOUT_S = 240.0


class CheckStatus(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: CheckStatus
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


Check = Callable[[], CheckResult]


def run_check(name: str, body: Callable[[], tuple[bool, dict[str, Any]]]) -> CheckResult:
    """Runs one check; a missing GPU or tests/ folder skips it, an exception fails it."""
    if not torch.cuda.is_available():
        return CheckResult(name, CheckStatus.SKIPPED, 0.0, {"reason": "no CUDA device"})
    start = time.perf_counter()
    try:
        passed, details = body()
    except Exception as error:  # the report records any failure
        return CheckResult(
            name, CheckStatus.FAILED, time.perf_counter() - start, {"error": repr(error)}
        )
    status = CheckStatus.PASSED if passed else CheckStatus.FAILED
    return CheckResult(name, status, time.perf_counter() - start, details)


def pytest_nodes(*targets: str) -> tuple[bool, dict[str, Any]]:
    """`pytest -m gpu` on the given targets; passes when pytest exits 0."""
    if not TESTS_DIR.is_dir():
        raise FileNotFoundError("tests/ not found: run from the source checkout")
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", *targets]
    result = subprocess.run(command, capture_output=True, text=True, timeout=420)
    return result.returncode == 0, {"command": " ".join(command[1:]), "tail": result.stdout[-1500:]}


def attention_bandwidth(seqs: int = 64, context: int = 2048) -> tuple[bool, dict[str, Any]]:
    """Triton decode attention's KV bytes read per second against a device-to-device copy."""
    from pdserve.kernels import triton_decode
    from pdserve.testing.kernel_cases import HeadConfig, make_paged_case

    case = make_paged_case([context] * seqs, HeadConfig(9, 3, 64, 16), torch.float16).to("cuda")
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    seconds = _cuda_time(lambda: triton_decode.decode_attention(*args))
    kv_bytes = 2 * seqs * context * 3 * 64 * 2  # K and V, 3 KV heads x 64 dims, fp16
    source = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    target = torch.empty_like(source)
    copy_bandwidth = 2 * source.nbytes / _cuda_time(lambda: target.copy_(source))
    ratio = kv_bytes / seconds / copy_bandwidth
    details = {
        "attention_gb_per_s": round(kv_bytes / seconds / 1e9, 1),
        "copy_gb_per_s": round(copy_bandwidth / 1e9, 1),
        "fraction_of_copy": round(ratio, 3),
        "shape": f"{seqs} seqs x {context} tokens, 9/3 heads, dim 64, fp16",
    }
    return True, details


def decode_step_graphs(
    model_dir: Path, batch_sizes: tuple[int, ...] = (1, 16)
) -> tuple[bool, dict[str, Any]]:
    """A decode step's forward eager vs replayed as a CUDA graph; the logits must agree."""
    model = LLM(model_dir, device="cuda", num_kv_blocks=64).engine.runner.model
    results = {f"batch_{size}": _graph_vs_eager(model, size) for size in batch_sizes}
    return all(r.pop("agree") for r in results.values()), results


def _graph_vs_eager(model: CausalLM, batch_size: int) -> dict[str, Any]:
    batch, cache = _decode_batch(model.config, batch_size, context=128)
    eager_s = _cuda_time(lambda: model.forward(batch, cache))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up (Triton autotuning, allocator) outside the capture
            model.forward(batch, cache)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        captured = model.forward(batch, cache)
    graph_s = _cuda_time(graph.replay)
    return {
        "agree": bool(torch.allclose(captured, model.forward(batch, cache), atol=1e-3)),
        "eager_ms": round(1e3 * eager_s, 3),
        "graph_ms": round(1e3 * graph_s, 3),
        "speedup": round(eager_s / graph_s, 2),
    }


def _decode_batch(
    config: ModelConfig, batch_size: int, context: int
) -> tuple[ForwardBatch, KVCache]:
    block_size = 16
    blocks_each = -(-context // block_size)
    layout = KVLayout(
        config.num_layers, config.num_kv_heads, config.head_dim, block_size, "float32"
    )
    cache = KVCache(layout, batch_size * blocks_each, "cuda")
    cache.tensor.normal_()
    tables = torch.arange(batch_size * blocks_each, dtype=torch.int32, device="cuda")
    tables = tables.view(batch_size, blocks_each)
    last = context - 1
    slots = tables[:, last // block_size].long() * block_size + last % block_size
    batch = ForwardBatch(
        input_ids=torch.randint(100, 1000, (batch_size,), device="cuda"),
        positions=torch.full((batch_size,), last, device="cuda"),
        slot_mapping=slots,
        num_decode_tokens=batch_size,
        decode=DecodeMetadata(
            tables, torch.full((batch_size,), context, dtype=torch.int32, device="cuda")
        ),
        prefill=None,
        logits_indices=torch.arange(batch_size, device="cuda"),
    )
    return batch, cache


def _cuda_time(call: Callable[[], object], repeats: int = 20) -> float:
    """Median seconds of `call` on the GPU (after 3 warm-up calls)."""
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def up_on_gpu(prompt: str = "The capital of France is") -> tuple[bool, dict[str, Any]]:
    """`pdserve up` with both tiers on CUDA, then one `pdserve generate` through the router."""
    pdserve = str(Path(sys.executable).with_name("pdserve"))
    port = "54051"  # off the defaults (50051, 9100), so a stack already up here is not in the way
    up = subprocess.Popen(
        [pdserve, "up", "--port", port, "--metrics-port", "54100", "--", "--device", "cuda"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_line(up, UP_READY_LINE, UP_TIMEOUT_S)
        generate = subprocess.run(
            [pdserve, "generate", "--address", f"127.0.0.1:{port}", "--max-tokens", "8", prompt],
            capture_output=True,
            text=True,
            timeout=120,
        )
        output = generate.stdout.strip()
        return generate.returncode == 0 and bool(output), {"generated": output[-300:]}
    finally:
        up.terminate()
        up.wait(timeout=60)


def _wait_for_line(process: subprocess.Popen[str], marker: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    for line in process.stdout:
        if marker in line:
            return
        if time.monotonic() > deadline:
            break
    raise TimeoutError(f"pdserve up did not print {marker!r} within {timeout_s} s")
