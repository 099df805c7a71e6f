"""How much of its core a worker's engine thread got while it had work, from Linux schedstat.

`/proc/PID/task/TID/schedstat` holds a thread's time on a CPU and its time runnable but waiting
for one (ns). Over a window, run / (run + wait) of the engine thread (the thread of the process
that ran most in the window) is the share of the core it got whenever it wanted to run: 1.0 alone
on its core, about 0.5 beside one other busy process. Blocked time (an idle engine waiting for
work) counts in neither, so the share is independent of how busy the worker was.
"""

from __future__ import annotations

from pathlib import Path

Snapshot = dict[int, tuple[int, int]]  # thread id -> (run ns, wait ns)


def snapshot(pid: int) -> Snapshot:
    threads: Snapshot = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run, wait, _ = (int(x) for x in (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        threads[int(task.name)] = (run, wait)
    return threads


def engine_share(before: Snapshot, after: Snapshot) -> float:
    """run / (run + wait) over the window of the thread that ran most in it (1.0 if none ran)."""
    deltas = [
        (run - before[tid][0], wait - before[tid][1])
        for tid, (run, wait) in after.items()
        if tid in before
    ]
    run, wait = max(deltas, default=(0, 0))
    return run / (run + wait) if run > 0 else 1.0
