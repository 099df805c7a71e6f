"""What a worker's `Load` reports of its scheduler, torch-free: the real engines and the
planner's simulated workers count it with this one function."""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.core.request import Request
from pdserve.core.sched.scheduler import Scheduler


@dataclass(frozen=True)
class EngineLoad:
    """The router's least-loaded choice and adaptive placement read it."""

    num_waiting: int  # accepted, not running yet
    num_running: int  # in the batch, or swapped out of it
    num_context_tokens: int  # context (prompt + output so far) of the running batch
    num_pending_prompt_tokens: int  # prompt tokens accepted and not yet computed
    num_free_blocks: int
    num_total_blocks: int
    num_cacheable_blocks: int  # KV blocks plus the offload tiers' (prefix blocks kept for reuse)


def load_of(scheduler: Scheduler) -> EngineLoad:
    """Read from the serving thread while the engine thread steps: copies of the queues first,
    so each count sees one consistent list (a count may be one step stale)."""
    waiting, running = list(scheduler.waiting), list(scheduler.running)
    usage = scheduler.kv_manager.usage()
    return EngineLoad(
        num_waiting=len(waiting),
        num_running=len(running) + len(scheduler.swapped),
        num_context_tokens=sum(r.num_tokens for r in running),
        num_pending_prompt_tokens=_prompt_left(waiting) + _prompt_left(running),
        num_free_blocks=usage.num_free_blocks,
        num_total_blocks=usage.num_blocks,
        num_cacheable_blocks=usage.num_blocks + usage.num_offload_blocks,
    )


def _prompt_left(requests: list[Request]) -> int:
    return sum(max(r.num_prompt_tokens - r.num_computed_tokens, 0) for r in requests)
