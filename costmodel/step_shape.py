"""What one engine step runs, in the features the cost model prices (costmodel/profile.py).

Plain data, no torch: the scheduler's step budget, the router's adaptive placement and the
planner's simulator all describe steps with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepShape:
    """What one step runs: the features the cost model reads."""

    prefill_tokens: int = 0  # new tokens of chunks with more than one token
    prefill_pairs: int = 0  # sum over those chunks of new * (start + new)
    decode_seqs: int = 0  # chunks of one token
    decode_context: int = 0  # sum of their context lengths (start + 1)

    @classmethod
    def of(cls, chunks: Sequence[tuple[int, int]]) -> StepShape:
        """From (start, num_new) per scheduled request, as the runner sees them."""
        prefill = [(s, n) for s, n in chunks if n > 1]
        decode = [s + 1 for s, n in chunks if n == 1]
        return cls(
            prefill_tokens=sum(n for _, n in prefill),
            prefill_pairs=sum(n * (s + n) for s, n in prefill),
            decode_seqs=len(decode),
            decode_context=sum(decode),
        )

    def vector(self) -> list[float]:
        return [
            1.0,
            self.prefill_tokens,
            self.prefill_pairs,
            self.decode_seqs,
            self.decode_context,
        ]

    @classmethod
    def prompt_chunk(cls, start: int, num_new: int) -> StepShape:
        """A prompt's tokens [start, start + num_new) computed in one step."""
        return cls.of([(start, num_new)])

    @classmethod
    def decodes(cls, num_seqs: int, context_tokens: int) -> StepShape:
        """`num_seqs` one-token decodes reading `context_tokens` tokens of context in all."""
        return cls(decode_seqs=num_seqs, decode_context=context_tokens)

    def __add__(self, other: StepShape) -> StepShape:
        """Both in one step."""
        return StepShape(
            prefill_tokens=self.prefill_tokens + other.prefill_tokens,
            prefill_pairs=self.prefill_pairs + other.prefill_pairs,
            decode_seqs=self.decode_seqs + other.decode_seqs,
            decode_context=self.decode_context + other.decode_context,
        )
