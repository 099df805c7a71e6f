"""Which requests draft each step, how many tokens, and the back-off of those whose drafts keep
failing; the worker's drafted and accepted counters.

A request drafts when its next step is a one-token decode (output begun, caught up, no forks
pending) and it has room left under `max_tokens` for the drafts plus the target's own next
token. Drafting is never free: every draft is a query token in the forward and its KV slot,
even when rejected. So each request keeps a moving acceptance rate and sits out a pause of
steps when it falls below BACKOFF_THRESHOLD; each pause in a row is twice as long as the last
(up to MAX_PAUSE_STEPS), and a good step resets it. A request whose drafts are mostly rejected
thus verifies drafts in at most one step of MAX_PAUSE_STEPS + 1 once it has settled.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.core.request import Request, RequestStatus
from pdserve.core.spec.proposer import Proposer

BACKOFF_THRESHOLD = 0.3  # acceptance (accepted / drafted) under which a request pauses
RATE_WEIGHT = 0.5  # weight of the latest step in the moving acceptance rate
MIN_PAUSE_STEPS = 4
MAX_PAUSE_STEPS = 64


@dataclass
class Backoff:
    """One request's moving acceptance rate and pause."""

    rate: float = 1.0  # optimistic: a request drafts from its first decode
    steps_left: int = 0  # steps it still sits out
    next_pause: int = MIN_PAUSE_STEPS

    def allows_drafts(self) -> bool:
        """Whether it drafts this step (a step it sits out counts down its pause)."""
        if self.steps_left > 0:
            self.steps_left -= 1
            return False
        return True

    def record(self, num_drafted: int, num_accepted: int) -> None:
        self.rate += RATE_WEIGHT * (num_accepted / num_drafted - self.rate)
        if self.rate >= BACKOFF_THRESHOLD:
            self.next_pause = MIN_PAUSE_STEPS
            return
        self.steps_left = self.next_pause
        self.next_pause = min(2 * self.next_pause, MAX_PAUSE_STEPS)
        # After the pause one good step resumes drafting for good, one bad step pauses again.
        self.rate = BACKOFF_THRESHOLD


class Speculator:
    def __init__(self, proposer: Proposer, num_speculative_tokens: int) -> None:
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens
        self.num_drafted_tokens = 0  # drafts verified since start
        self.num_accepted_tokens = 0  # of which the target agreed with
        # Weak keys: a request's state goes when the engine forgets it, whichever way it ends.
        self._backoffs: weakref.WeakKeyDictionary[Request, Backoff] = weakref.WeakKeyDictionary()

    @property
    def acceptance_rate(self) -> float:
        """Share of verified drafts the target agreed with (0 before any)."""
        return self.num_accepted_tokens / max(self.num_drafted_tokens, 1)

    def propose(self, requests: Sequence[Request]) -> None:
        """Sets `draft_token_ids` of every request given: drafts for those that may, else []."""
        drafting: list[Request] = []
        limits: list[int] = []
        for request in requests:
            request.draft_token_ids = []
            limit = self._draft_limit(request)
            if limit > 0 and self._backoffs.setdefault(request, Backoff()).allows_drafts():
                drafting.append(request)
                limits.append(limit)
        if drafting:
            for request, drafts in zip(
                drafting, self.proposer.propose(drafting, limits), strict=True
            ):
                request.draft_token_ids = drafts

    def _draft_limit(self, request: Request) -> int:
        """How many tokens it may draft this step: 0 unless its next step is a decode."""
        # Output already begun: a prompt chunked up to its last token is not decoding yet. (A
        # prefill worker's jobs, resumed ones too, are never offered: `LLMEngine._may_draft`.)
        decodes_next = (
            request.status is RequestStatus.RUNNING
            and not request.forks
            and bool(request.output_token_ids)
            and request.num_computed_tokens == request.num_tokens - 1
        )
        if not decodes_next:
            return 0
        # The target's own next token comes on top: never past max_tokens (nor the context).
        room = request.params.max_tokens - len(request.output_token_ids) - 1
        return min(self.num_speculative_tokens, room)

    def record(self, request: Request, num_drafted: int, num_accepted: int) -> None:
        """A step verified `num_drafted` drafts of `request`; the target agreed with the first
        `num_accepted`."""
        self.num_drafted_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        self._backoffs.setdefault(request, Backoff()).record(num_drafted, num_accepted)
