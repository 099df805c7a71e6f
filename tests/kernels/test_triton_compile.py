"""Every Triton kernel variant compiles to a cubin for sm_80 and sm_90, with no GPU present.

Each architecture compiles in its own subprocess (in parallel) without TRITON_INTERPRET and with a
fresh Triton cache, so nothing is reused from an earlier run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

pytest.importorskip("triton")

ARCHS = (80, 90)
KERNEL_LABELS = ("decode", "merge", "prefill", "write_kv", "copy_blocks")


def test_every_kernel_variant_compiles_for_ampere_and_hopper(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    runs = []
    for arch in ARCHS:
        command = [sys.executable, "-m", "pdserve.kernels.triton_compile", str(arch)]
        arch_env = {**env, "TRITON_CACHE_DIR": str(tmp_path / f"cache{arch}")}
        runs.append(
            subprocess.Popen(command, env=arch_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    for arch, run in zip(ARCHS, runs, strict=True):
        stdout, stderr = run.communicate(timeout=600)
        output = stdout.decode()
        assert run.returncode == 0, output + stderr.decode()[-6000:]
        compiled = [line for line in output.splitlines() if line.startswith(f"sm_{arch} ")]
        for label in KERNEL_LABELS:
            for dtype in ("fp32", "fp16", "bf16"):
                assert any(f" {label} {dtype}" in line for line in compiled), (label, dtype)
        assert all(int(line.split("cubin ")[1].split()[0]) > 0 for line in compiled)
