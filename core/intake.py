"""What a request must be to enter an engine: token ids inside the vocabulary, prompt plus
`max_tokens` within the model's context and the KV pool, and resumed output (a migration's) that
its grammar accepts. The engine and the tier engines' hooks check through it, so each rule is
written once and every refusal names its field (InvalidRequestError)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.kv.sliding_window import max_live_blocks
from pdserve.core.model.config import ModelConfig
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.structured.grammar import Grammars, GrammarState

RESUMED_FIELD = "resumed_output_token_ids"


@dataclass(frozen=True)
class RequestIntake:
    config: EngineConfig
    model_config: ModelConfig
    tokenizer: Any
    grammars: Grammars

    def prompt_token_ids(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids (text is tokenized); refused if empty or outside the vocab."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt", "must not be empty")
            return list(self.tokenizer.encode(prompt))
        if not isinstance(prompt, list) or not prompt:
            raise InvalidRequestError("prompt_token_ids", "must be a non-empty list of token ids")
        return self.token_ids(prompt, "prompt_token_ids")

    def token_ids(self, token_ids: list[int], field: str) -> list[int]:
        vocab = self.model_config.vocab_size
        for token_id in token_ids:
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise InvalidRequestError(field, "every token id must be an integer")
            if not 0 <= token_id < vocab:
                raise InvalidRequestError(
                    field, f"token id {token_id} is outside the vocabulary [0, {vocab})"
                )
        return list(token_ids)

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Refuses a request that could never finish here: past the model's context, or needing
        more KV blocks than the whole pool (a sliding window bounds what it holds)."""
        context = self.model_config.max_position
        if prompt_len + max_tokens > context:
            raise InvalidRequestError(
                "sampling.max_tokens",
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                f"context length of {context}",
            )
        needed = blocks_for(prompt_len + max_tokens, self.config.block_size)
        window = self.model_config.sliding_window
        if window is not None:  # it holds no more than a step's window, however long it grows
            step = max_live_blocks(
                window, self.config.block_size, self.config.max_num_batched_tokens
            )
            needed = min(needed, step)
        if needed > self.config.num_kv_blocks:
            raise InvalidRequestError(
                "sampling.max_tokens",
                f"prompt + max_tokens needs {needed} KV blocks, more than the whole cache "
                f"({self.config.num_kv_blocks})",
            )

    def resumed_output(self, resumed: Sequence[int], params: SamplingParams) -> list[int]:
        """A migration's already-streamed output, checked: one sample, room left under
        max_tokens, ids in the vocabulary, accepted by the request's grammar."""
        if not resumed:
            return []
        if params.n != 1:
            raise InvalidRequestError(
                RESUMED_FIELD, f"a resumed request runs one sample, not n={params.n}"
            )
        if len(resumed) >= params.max_tokens:
            raise InvalidRequestError(
                RESUMED_FIELD,
                f"{len(resumed)} tokens leave none of max_tokens ({params.max_tokens})",
            )
        token_ids = self.token_ids(list(resumed), RESUMED_FIELD)
        if params.structured_outputs is not None:  # a matcher to check with, not the request's own
            grammar = GrammarState(
                self.grammars.compiled(params.structured_outputs), self.grammars.stop_token_ids
            )
            if not grammar.advance_all(token_ids):
                raise InvalidRequestError(
                    RESUMED_FIELD, "the grammar of `structured` refuses these tokens"
                )
        return token_ids
