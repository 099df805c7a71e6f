"""Runs interpreter_cases.py in a subprocess with TRITON_INTERPRET=1 (see that file for why)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

pytest.importorskip("triton")

CASES = Path(__file__).with_name("interpreter_cases.py")


def test_triton_kernels_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
