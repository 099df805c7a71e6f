"""Least-loaded worker choice, as pure functions over load snapshots.

Each tier is chosen on its own. A worker's load is what it last reported (`Load`: waiting,
running, free KV blocks) plus the requests this router sent it since that report, which the
report cannot know yet; without them a burst between two polls would all land on the worker that
looked idlest at the last poll.

Order of preference: the fewest queued requests (waiting + sent since the poll: work that cannot
run yet), then the fewest running (a bigger batch makes every step slower), then the smallest
fraction of KV blocks in use (a fuller cache is closer to making Reserve wait or to preempting).
Exact ties (typically idle workers) go round robin, so equal workers share the traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerLoad:
    num_waiting: int = 0
    num_running: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    # Requests the router sent this worker after its last load report.
    dispatched_since_poll: int = 0

    @property
    def used_block_fraction(self) -> float:
        if self.num_total_blocks <= 0:
            return 0.0
        used = self.num_total_blocks - min(self.num_free_blocks, self.num_total_blocks)
        return used / self.num_total_blocks


LoadKey = tuple[int, int, float]


def load_key(load: WorkerLoad) -> LoadKey:
    """Smaller is less loaded; compared as a tuple (see the module docstring)."""
    queued = load.num_waiting + load.dispatched_since_poll
    return (queued, load.num_running, load.used_block_fraction)


def least_loaded(loads: Sequence[WorkerLoad], turn: int) -> int:
    """Index of the least-loaded worker; `turn` (a counter the caller advances) breaks ties."""
    if not loads:
        raise ValueError("loads: no worker to choose from")
    keys = [load_key(load) for load in loads]
    best = min(keys)
    tied = [index for index, key in enumerate(keys) if key == best]
    return tied[turn % len(tied)]
