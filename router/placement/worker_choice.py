"""Least-loaded worker choice, as pure functions over load snapshots.

Each tier is chosen on its own. A worker's load is what it last reported (`Load`: waiting,
running, free KV blocks) plus the requests this router sent it since that report, which the
report cannot know yet; without them a burst between two polls would all land on the worker that
looked idlest at the last poll.

Order of preference: the fewest queued requests (waiting + sent since the poll: work that cannot
run yet), then the fewest running (a bigger batch makes every step slower), then the smallest
fraction of KV blocks in use (a fuller cache is closer to making Reserve wait or to preempting).
Exact ties (typically idle workers) go round robin, so equal workers share the traffic.

With `--routing-policy prefix`, `prefix_choice` first prefers the worker most likely to hold the
prompt's leading KV blocks in its prefix cache (prefix_map.py), within a load bound.
With `--routing-policy prefix-hash`, `rendezvous_choice` sends a prompt to the worker its leading
blocks hash to (prefix_hash.py): the same choice in every router replica, with no state.
"""

from __future__ import annotations

import enum
import hashlib
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


class RoutingPolicy(enum.Enum):
    """`--routing-policy`: how a worker is chosen among the healthy ones of a tier."""

    LEAST_LOADED = "least-loaded"
    PREFIX = "prefix"  # the worker whose recent prompts share the most leading blocks (see below)
    # The worker the prompt's leading blocks hash to, within a load bound: replicas agree.
    PREFIX_HASH = "prefix-hash"


# A worker whose map matches is passed over when it has more than this many queued requests
# beyond the least-loaded worker: past that, waiting costs more than recomputing (or
# re-sending) a prefix. SGLang's cache-aware router has the same escape (balance thresholds).
PREFIX_BALANCE_SLACK = 4
# Matches shorter than this share of the prompt's full blocks (a chat template's header, say)
# do not count: they save little and would pile unrelated requests onto one worker.
MIN_PREFIX_SHARE = 0.25


def prefix_choice(
    loads: Sequence[WorkerLoad], matched: Sequence[int], num_blocks: int, turn: int
) -> int:
    """Index of the worker for a prompt of `num_blocks` full blocks, `matched[i]` of whose
    leading blocks worker i has seen recently.

    The workers with the longest match, if it covers at least MIN_PREFIX_SHARE of the blocks;
    of those the least loaded, unless its queue exceeds the least-loaded worker's by more than
    PREFIX_BALANCE_SLACK or its KV blocks are all in use. Otherwise (no useful match, or the
    matching worker is overloaded): `least_loaded`.
    """
    if len(matched) != len(loads):
        raise ValueError(f"matched: {len(matched)} counts for {len(loads)} workers")
    fallback = least_loaded(loads, turn)
    best = max(matched, default=0)
    if best == 0 or best < MIN_PREFIX_SHARE * num_blocks:
        return fallback
    holders = [index for index, count in enumerate(matched) if count == best]
    chosen = holders[least_loaded([loads[index] for index in holders], turn)]
    queued = load_key(loads[chosen])[0] - load_key(loads[fallback])[0]
    full = loads[chosen].num_total_blocks > 0 and loads[chosen].num_free_blocks == 0
    return fallback if queued > PREFIX_BALANCE_SLACK or full else chosen


def rendezvous_rank(key: bytes, addresses: Sequence[str]) -> list[int]:
    """Indexes of `addresses` in `key`'s order of preference (rendezvous hashing: each worker's
    score is a hash of the key and its address). Every process ranks alike; a worker that comes
    or goes moves only the keys it ranks first."""

    def score(index: int) -> bytes:
        return hashlib.blake2b(key + addresses[index].encode(), digest_size=8).digest()

    return sorted(range(len(addresses)), key=score, reverse=True)


def rendezvous_choice(
    loads: Sequence[WorkerLoad], addresses: Sequence[str], key: bytes | None, turn: int
) -> int:
    """Index of the worker for a prompt whose leading blocks hash to `key`: the first in the
    key's ranking whose queue is within PREFIX_BALANCE_SLACK of the least-loaded worker's and
    that has a free KV block (bounded-load consistent hashing: an overloaded worker's keys
    spill to their next worker, the same one in every replica). No key (no full block) or no
    worker within the bound: `least_loaded`."""
    if len(addresses) != len(loads):
        raise ValueError(f"addresses: {len(addresses)} for {len(loads)} workers")
    fallback = least_loaded(loads, turn)
    if key is None:
        return fallback
    lightest = load_key(loads[fallback])[0]
    for index in rendezvous_rank(key, addresses):
        load = loads[index]
        full = load.num_total_blocks > 0 and load.num_free_blocks == 0
        if load_key(load)[0] - lightest <= PREFIX_BALANCE_SLACK and not full:
            return index
    return fallback
