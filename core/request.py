"""A request's state as it moves through the scheduler."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pdserve.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pdserve.core.sampler import SeededNoise
    from pdserve.core.structured.grammar import GrammarState


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_KV = "waiting_for_kv"  # decode tier: blocks reserved, KV still in flight
    RUNNING = "running"
    SWAPPED = "swapped"
    SUSPENDED = "suspended"  # decode tier: stopped between steps, its KV kept for a live migration
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "aborted"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {
    RequestStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH,
    RequestStatus.FINISHED_ABORTED,
    RequestStatus.FINISHED_ERROR,
}


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_order: int  # ties in arrival time are broken by this, so ordering is total
    arrival_time: float
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    # Its block table, one slot per block of its tokens; with a sliding window the leading slots
    # whose blocks slid out hold `sliding_window.NULL_BLOCK` (no block).
    block_ids: list[int] = field(default_factory=list)
    swap_block_ids: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    first_scheduled_time: float | None = None  # monotonic; queue time ends here
    noise: SeededNoise | None = None  # the request's own sampling noise when it has a seed
    block_hashes: list[bytes] = field(default_factory=list)  # of its full blocks, grown lazily
    # n > 1: the other samples of this prompt. They wait until this request has computed all but
    # the last prompt token, then share its blocks (copy-on-write) and go on on their own.
    forks: list[Request] = field(default_factory=list)
    sample_index: int = 0  # which of the n samples; they share arrival_order and rank in order
    # Speculative decoding: tokens proposed to follow its context, not yet verified. They never
    # enter `output_token_ids` (nor the prefix cache) unless the target model agrees.
    draft_token_ids: list[int] = field(default_factory=list)
    # Its structured constraint's matcher, having accepted exactly `output_token_ids` (None:
    # unconstrained); the sampler masks its logits with what the grammar allows next.
    grammar: GrammarState | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def fork_point(self) -> int:
        """Tokens this request's forks start from: each computes the last prompt token itself,
        into its own copy of the partly filled last block, and samples from its own logits."""
        return self.num_prompt_tokens - 1

    @property
    def target_tokens(self) -> int:
        """Tokens to compute before the next sample (or, with forks pending, before the fork)."""
        return self.fork_point if self.forks else self.num_tokens

    @property
    def remaining_work(self) -> int:
        """Tokens left to process: uncomputed ones and the outputs still to come."""
        left_to_generate = self.params.max_tokens - len(self.output_token_ids)
        return self.num_tokens - self.num_computed_tokens + left_to_generate

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_id(self, index: int) -> int:
        prompt_len = len(self.prompt_token_ids)
        if index < prompt_len:
            return self.prompt_token_ids[index]
        return self.output_token_ids[index - prompt_len]
