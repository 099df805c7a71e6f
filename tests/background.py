"""The test session's background processes (strict mypy, transformers' references): started at
the lowest CPU priority, so they run on what the tests leave idle, and raised back to a normal
priority once a test waits for one: then nothing else should come first. Without the raise, any
other load on the host (a burner at normal priority was enough here) starved the waited-for
process and the session with it. Raising a priority needs root (CAP_SYS_NICE); elsewhere the
process keeps its low one and the wait takes what the host leaves it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

LOWEST = 19
NORMAL = 0


def lowest_priority() -> None:
    """`preexec_fn` of a background process: it and every thread it starts run at LOWEST."""
    os.nice(LOWEST)


def raise_priority(pid: int) -> None:
    """Every thread of process `pid` back to NORMAL (Linux priorities are per thread), where
    permitted; a process that has ended is left alone."""
    for task in _threads(pid):
        with contextlib.suppress(PermissionError, ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, task, NORMAL)


def _threads(pid: int) -> list[int]:
    try:
        return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    except FileNotFoundError:
        return []
