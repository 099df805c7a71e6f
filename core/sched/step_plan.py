"""One scheduler step's plan: built in a `StepPlan`, handed to the runner as a `SchedulerOutput`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pdserve.core.request import Request


class PrefillLimit(Protocol):
    """How many prompt tokens one step may still take (one object per step: it counts what it
    granted)."""

    def grant(self, start: int, wanted: int) -> int:
        """New tokens, at most `wanted`, for a prompt chunk starting at token `start`."""
        ...


class StepBudget(Protocol):
    """Caps each step's prompt tokens (an ITL SLO, costmodel/step_budget.py); the scheduler asks
    it once per step, with the requests the step decodes."""

    def for_step(self, decodes: Sequence[Request]) -> PrefillLimit: ...

    @property
    def last_cap_s(self) -> float | None:
        """The cap the last step's prompt tokens were held to (None: none yet, or no cap)."""
        ...


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's plan: only ids and ints, so it can cross into the runner (or a process)."""

    num_scheduled_tokens: dict[str, int]  # request id -> new tokens this step, in run order
    swap_out: tuple[tuple[int, int], ...]  # (device block, swap block) pairs
    swap_in: tuple[tuple[int, int], ...]  # (swap block, device block) pairs
    preempted_ids: tuple[str, ...]
    copies: tuple[tuple[int, int], ...] = ()  # copy-on-write (device src, device dst) pairs
    # Speculative decoding: request id -> its drafted tokens, verified this step. They are the
    # last of its scheduled tokens (counted in `num_scheduled_tokens`).
    draft_token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


class StepPlan:
    """The plan being built for one step."""

    def __init__(
        self,
        budget: int,
        prefill_limit: PrefillLimit | None = None,
        joining: frozenset[str] = frozenset(),
    ) -> None:
        self.budget = budget
        self.prefill_limit = prefill_limit
        # Queued requests one token behind (their KV here) that join this step: prompt chunks
        # leave a token of the budget for each (Scheduler._decodes_joining).
        self.joining = joining
        self.scheduled: dict[str, int] = {}
        self.swap_out: list[tuple[int, int]] = []
        self.swap_in: list[tuple[int, int]] = []
        self.copies: list[tuple[int, int]] = []
        self.preempted: list[str] = []
        self.drafts: dict[str, tuple[int, ...]] = {}
        self.best_preempted: tuple[float, int, int] | None = (
            None  # rank of the best request preempted
        )

    def tokens_for(self, request: Request) -> int:
        """New tokens for `request` this step: what it lacks, within the token budget and, for
        a prompt chunk, the prefill limit (0: no room left this step).

        A prompt chunk leaves a token for each joining decode not yet scheduled, but keeps one
        token itself: the joiners may rank below it, and a chunk left nothing would let them
        run while it (perhaps preempted) waits, or, ahead of them in the queue, stall the step."""
        wanted = min(request.target_tokens - request.num_computed_tokens, self.budget)
        if wanted <= 1:
            return wanted
        held = len(self.joining - self.scheduled.keys() - {request.request_id})
        wanted = max(min(wanted, self.budget - held), 1)
        if self.prefill_limit is None:
            return wanted
        return self.prefill_limit.grant(request.num_computed_tokens, wanted)

    def schedule(self, request: Request, num_new: int) -> None:
        self.scheduled[request.request_id] = num_new
        self.budget -= num_new

    def add_drafts(self, request: Request, drafts: list[int]) -> None:
        """`request`, scheduled to catch up, also verifies `drafts` after its last token."""
        self.scheduled[request.request_id] += len(drafts)
        self.budget -= len(drafts)
        self.drafts[request.request_id] = tuple(drafts)

    def output(self) -> SchedulerOutput:
        return SchedulerOutput(
            num_scheduled_tokens=self.scheduled,
            swap_out=tuple(self.swap_out),
            swap_in=tuple(self.swap_in),
            preempted_ids=tuple(self.preempted),
            copies=tuple(self.copies),
            draft_token_ids=self.drafts,
        )

    def unschedule(self, request: Request) -> None:
        self.budget += self.scheduled.pop(request.request_id, 0)
        self.drafts.pop(request.request_id, None)

    def cancel_copies(self, block_ids: list[int]) -> list[int]:
        """A request preempted after a copy-on-write this step: drops its copies and returns
        its blocks with each uncopied one replaced by the source, which a swap-out (the first
        copy of a step) still finds intact."""
        source_of = {dst: src for src, dst in self.copies}
        self.copies = [(src, dst) for src, dst in self.copies if dst not in block_ids]
        return [source_of.get(block_id, block_id) for block_id in block_ids]
