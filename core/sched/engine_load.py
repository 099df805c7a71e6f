"""What a worker's `Load` reports of its scheduler, torch-free: the real engines and the
planner's simulated workers count it with this one function."""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.core.request import Request
from pdserve.core.sched.scheduler import Scheduler


@dataclass(frozen=True)
class EngineLoad:
    """The router's least-loaded choice and adaptive placement read it."""

    num_waiting: int  # accepted, not decoding yet: queued, or its prompt still being computed
    num_running: int  # decoding streams: in the batch with their prompt computed, or swapped out
    num_context_tokens: int  # context (prompt + output so far) of the decoding streams in the batch
    num_pending_prompt_tokens: int  # prompt tokens accepted and not yet computed
    num_free_blocks: int
    num_total_blocks: int
    num_cacheable_blocks: int  # KV blocks plus the offload tiers' (prefix blocks kept for reuse)
    step_cap_s: float = 0.0  # the cap its step budget held the last step's prompt tokens to


def load_of(scheduler: Scheduler) -> EngineLoad:
    """Read from the serving thread while the engine thread steps: copies of the queues first,
    so each count sees one consistent list (a count may be one step stale).

    A request in the batch whose prompt is still being computed (in chunks) is a pending prompt,
    not a stream: read as a stream, a decode worker prefilling one long prompt alone looked to
    the router like one whose steps an ITL SLO caps, and its next step was priced at a fraction
    of the whole chunk it ran (a hand-off waited 3.2 s where 0.98 s was predicted,
    docs/disaggregation.md, the chat-heavy mix)."""
    waiting, running = list(scheduler.waiting), list(scheduler.running)
    prefilling = [r for r in running if _prompt_left_of(r)]
    decoding = [r for r in running if not _prompt_left_of(r)]
    usage = scheduler.kv_manager.usage()
    return EngineLoad(
        num_waiting=len(waiting) + len(prefilling),
        num_running=len(decoding) + len(scheduler.swapped),
        num_context_tokens=sum(r.num_tokens for r in decoding),
        num_pending_prompt_tokens=sum(map(_prompt_left_of, waiting + prefilling)),
        num_free_blocks=usage.num_free_blocks,
        num_total_blocks=usage.num_blocks,
        num_cacheable_blocks=usage.num_blocks + usage.num_offload_blocks,
        step_cap_s=_last_cap_of(scheduler),
    )


def _last_cap_of(scheduler: Scheduler) -> float:
    budget = scheduler.step_budget
    cap = None if budget is None else budget.last_cap_s
    return cap or 0.0


def _prompt_left_of(request: Request) -> int:
    return max(request.num_prompt_tokens - request.num_computed_tokens, 0)
