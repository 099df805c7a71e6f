"""Speculative decoding's proposer interface: what drafts tokens for the target model to verify.

Before each step the engine asks a proposer for the tokens likely to follow each request that
decodes next; the scheduler gives the drafts slots in the step (core/sched/scheduler.py), the runner
verifies all of them in one forward pass (core/spec/verify.py) and the target's own tokens
decide what is kept. A guess is never trusted, so a proposer may be cheap and often wrong: a
wrong draft costs its slot in the forward, nothing more.

N-gram (prompt lookup) drafting is the one proposer today (core/spec/ngram.py). A draft
model would be another behind the same call: its own weights and small paged KV cache, one
batched forward per drafted token over the requests given here. EAGLE-style heads would also
need the target's last hidden states, which the runner would hand back with the logits
(docs/speculative.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pdserve.core.config import NGRAM, EngineConfig
from pdserve.core.request import Request


class Proposer(Protocol):
    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int]) -> list[list[int]]:
        """For each request, at most `max_drafts[i]` tokens guessed to follow its context
        (prompt + output so far); an empty list when it has no guess."""
        ...


def make_proposer(config: EngineConfig) -> Proposer | None:
    """The proposer `config.speculative` names; None when speculation is off."""
    if config.speculative == NGRAM:
        from pdserve.core.spec.ngram import NgramProposer

        return NgramProposer()
    return None
