"""The chaos suite: faults injected into real clusters (processes on 127.0.0.1, real UCX).

The default test run has the short version (one pass per scenario); `PDSERVE_CHAOS_ROUNDS=N`
repeats every scenario N times (docs/reliability.md has the long run's command and figures).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def chaos_rounds() -> int:
    return int(os.environ.get("PDSERVE_CHAOS_ROUNDS", "1"))
