"""A worker's grammars: each request's constraint compiled against the tokenizer (llguidance),
cached by constraint, and the per-request matcher that says which tokens may come next.

Why llguidance (docs/structured_outputs.md has the run): on this CPU, over the shipped schemas,
it builds a grammar in about 1 ms where xgrammar takes about 1 s and outlines-core 2 s (it
builds lazily), its next-token mask costs 88 us on average against 338 us and 399 us, and its
mask kernel applies 16 rows in a third of a millisecond; it rolls back and validates drafts,
which speculative decoding needs, and takes JSON schemas, regexes and Lark grammars (GBNF is
converted to Lark).

Building a matcher may still take long for a pathological grammar (the library's own figure:
100-1000 ms for extremely complex ones; it drops the GIL meanwhile), so the serving path compiles
on this object's own threads (`prepare`, bounded by `compile_timeout_s`) before the request
reaches the engine thread, which then copies the cached matcher. The offline API compiles on
the caller's thread (`state_for`), as nothing else waits on it there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import torch
from llguidance.gbnf_to_lark import any_to_lark

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.core.structured.params import StructuredKind, StructuredOutputsParams

COMPILE_TIMEOUT_S = 10.0
MAX_CACHED_GRAMMARS = 256
COMPILE_THREADS = 2  # one pathological grammar never holds up every other compile
MAX_ERROR_CHARS = 300
ANY_OBJECT_SCHEMA = '{"type": "object"}'
# Why a matcher stopped once the output is complete and its end-of-sequence token consumed.
END_OF_SENTENCE = "EndOfSentence"

_Key = tuple[StructuredKind, str]


class GrammarState:
    """One request's place in its grammar: it has accepted exactly the request's output tokens
    (the engine advances it with each token it appends, and a resumed request's by its resumed
    output), so the mask it fills is the set of tokens allowed next."""

    __slots__ = ("_ended_here", "_matcher", "_stop_token_ids", "num_accepted")

    def __init__(self, template: llguidance.LLMatcher, stop_token_ids: frozenset[int]) -> None:
        self._matcher = template.deep_copy()
        self._stop_token_ids = stop_token_ids
        # Once the output is complete the matcher stops and refuses every token, although its
        # mask allows the end-of-sequence one: accepted here, without the matcher.
        self._ended_here = False
        self.num_accepted = 0  # tokens it has accepted (and not rolled back)

    def advance(self, token: int) -> bool:
        """Accepts `token`; False (and unchanged) if the grammar does not allow it here."""
        if self._ended_here:
            return False
        if self._matcher.is_stopped():
            if token not in self._stop_token_ids:
                return False
            self._ended_here = True
        elif self._matcher.try_consume_tokens([token]) != 1:  # refused: left as it was
            return False
        self.num_accepted += 1
        return True

    def catch_up(self, output_token_ids: Sequence[int]) -> bool:
        """Accepts the output tokens it has not seen yet (a resumed request's); False, having
        accepted none of them, if the grammar refuses one."""
        return self.advance_all(output_token_ids[self.num_accepted :])

    def advance_all(self, tokens: Sequence[int]) -> bool:
        """Accepts every token or, if one is refused, none of them."""
        for accepted, token in enumerate(tokens):
            if not self.advance(token):
                self.rollback(accepted)
                return False
        return True

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the grammar allows in a row (it stays where it was)."""
        accepted = 0
        for token in tokens:
            if not self.advance(token):
                break
            accepted += 1
        self.rollback(accepted)
        return accepted

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._ended_here:
            self._ended_here = False
            self.num_accepted -= 1
            num_tokens -= 1
        if num_tokens:
            self._matcher.rollback(num_tokens)
            self.num_accepted -= num_tokens

    def fill_mask(self, bitmask: np.ndarray, row: int) -> None:
        """Writes the tokens allowed next into row `row` of an int32 bitmask (bit j of word w:
        token 32 w + j)."""
        llguidance.numpy.fill_next_token_bitmask(self._matcher, bitmask, row)

    @property
    def terminated(self) -> bool:
        """Whether the output is complete and its end-of-sequence token accepted."""
        matcher = self._matcher
        ended = matcher.is_stopped() and str(matcher.stop_reason()) == END_OF_SENTENCE
        return self._ended_here or bool(ended)


@dataclass(frozen=True)
class ConstrainedRows:
    """A constrained request's logits rows in a step: from `first_row`, one per position it
    samples or verifies; row i is masked as after its first i `drafts`."""

    first_row: int
    grammar: GrammarState
    drafts: tuple[int, ...] = ()


def mask_logits(logits: torch.Tensor, constrained: Sequence[ConstrainedRows]) -> int:
    """Sets to -inf, in place, every logit the row's grammar refuses (other rows untouched);
    the number of rows masked."""
    if not constrained:
        return 0
    rows = [
        entry.first_row + offset for entry in constrained for offset in range(len(entry.drafts) + 1)
    ]
    bitmask = llguidance.numpy.allocate_token_bitmask(len(rows), logits.shape[-1])
    filled = 0
    for entry in constrained:
        grammar = entry.grammar
        for offset in range(len(entry.drafts) + 1):
            grammar.fill_mask(bitmask, filled)
            filled += 1
            if offset < len(entry.drafts):
                advanced = grammar.advance(entry.drafts[offset])
                assert advanced, "drafts are cut where the grammar refuses one"
        grammar.rollback(len(entry.drafts))
    if rows == list(range(logits.shape[0])):  # every row: in place, no copy
        apply_bitmask(logits, bitmask)
        return len(rows)
    masked = logits[rows]
    apply_bitmask(masked, bitmask)
    logits[rows] = masked
    return len(rows)


def apply_bitmask(logits: torch.Tensor, bitmask: np.ndarray) -> None:
    """Sets to -inf, in place, each logit whose bit in its row of `bitmask` is 0.

    Not llguidance.torch's applier: that one is a torch.compile'd function, so importing it
    loads dynamo and inductor into every worker (seconds of start-up) and its first call
    compiles C++ on the engine thread, with a compiler the pod may not have."""
    # The words' bytes in little-endian order (a no-op view on little-endian hosts), so that
    # the bits unpack in token order.
    words = bitmask.astype("<i4", copy=False).view(np.uint8)
    refused = np.unpackbits(~words, axis=1, count=logits.shape[-1], bitorder="little")
    logits.masked_fill_(torch.from_numpy(refused).view(torch.bool), float("-inf"))


class Grammars:
    """One worker's compiler and cache (every thread may call it)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        compile_timeout_s: float = COMPILE_TIMEOUT_S,
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self.stop_token_ids = frozenset(stop_token_ids)
        self.compile_timeout_s = compile_timeout_s
        self._lock = threading.Lock()  # the cache and the pending compiles
        self._compiler_lock = threading.Lock()  # the tokenizer's info, built once
        self._llg_tokenizer: llguidance.LLTokenizer | None = None  # built on first use (~0.5 s)
        # Compiled: a matcher at the grammar's start, copied for each request.
        self._cached: OrderedDict[_Key, llguidance.LLMatcher] = OrderedDict()
        self._pending: dict[_Key, concurrent.futures.Future[llguidance.LLMatcher]] = {}
        self._threads = concurrent.futures.ThreadPoolExecutor(
            COMPILE_THREADS, thread_name_prefix="grammar-compile"
        )
        # What the worker's metrics read (core/serving/structured_metrics.py).
        self.num_requests = 0  # constrained requests (each sample counts)
        self.num_compiles = 0
        self.compile_seconds = 0.0
        self.num_masked_rows = 0
        self.mask_seconds = 0.0  # filling and applying masks, on the engine thread

    async def prepare(self, structured: StructuredOutputsParams | None) -> None:
        """Compiles the constraint off the caller's thread, waiting at most
        `compile_timeout_s`; raises InvalidRequestError naming the field if it does not compile
        (or not in time: the compile goes on, and a later request may find it done)."""
        if structured is None:
            return
        compiling = self._compile_soon(structured)
        try:
            await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(compiling)), self.compile_timeout_s
            )
        except TimeoutError:
            raise InvalidRequestError(
                _field(structured),
                f"did not compile within {self.compile_timeout_s:g} s; simplify it",
            ) from None

    def state_for(self, structured: StructuredOutputsParams) -> GrammarState:
        """A fresh matcher; compiles here, on the caller's thread, if nothing has yet."""
        state = GrammarState(self.compiled(structured), self.stop_token_ids)
        self.num_requests += 1
        return state

    def mask(self, logits: torch.Tensor, constrained: Sequence[ConstrainedRows]) -> None:
        """`mask_logits`, timed."""
        if not constrained:
            return
        started = time.perf_counter()
        # Logits from a forward run in inference mode may only be updated in it.
        with torch.inference_mode():
            self.num_masked_rows += mask_logits(logits, constrained)
        self.mask_seconds += time.perf_counter() - started

    def compiled(self, structured: StructuredOutputsParams) -> llguidance.LLMatcher:
        """The compiled constraint (compiled here if nothing has yet); raises
        InvalidRequestError naming the field if it does not compile."""
        return self._compile_soon(structured).result()

    def _compile_soon(
        self, structured: StructuredOutputsParams
    ) -> concurrent.futures.Future[llguidance.LLMatcher]:
        key = (structured.kind, structured.text)
        with self._lock:
            cached = self._cached.get(key)
            if cached is not None:
                self._cached.move_to_end(key)
                done: concurrent.futures.Future[llguidance.LLMatcher] = concurrent.futures.Future()
                done.set_result(cached)
                return done
            pending = self._pending.get(key)
            if pending is None:
                pending = self._threads.submit(self._compile, key, structured)
                self._pending[key] = pending
            return pending

    def _compile(self, key: _Key, structured: StructuredOutputsParams) -> llguidance.LLMatcher:
        started = time.perf_counter()
        try:
            compiled = _matcher_for(self._tokenizer_info(), structured)
        finally:
            with self._lock:
                self._pending.pop(key, None)
        with self._lock:
            self.num_compiles += 1
            self.compile_seconds += time.perf_counter() - started
            self._cached[key] = compiled
            while len(self._cached) > MAX_CACHED_GRAMMARS:
                self._cached.popitem(last=False)
        return compiled

    def _tokenizer_info(self) -> llguidance.LLTokenizer:
        with self._compiler_lock:
            if self._llg_tokenizer is None:
                self._llg_tokenizer = llguidance.hf.from_tokenizer(
                    self._tokenizer, n_vocab=self._vocab_size, eos_token=sorted(self.stop_token_ids)
                )
            return self._llg_tokenizer


def _matcher_for(
    tokenizer: llguidance.LLTokenizer, structured: StructuredOutputsParams
) -> llguidance.LLMatcher:
    """A matcher at the start of the constraint's grammar; InvalidRequestError naming the field
    if it does not compile."""
    try:
        grammar = _grammar_of(structured)
    except Exception as error:  # the GBNF converter's: the message says what is wrong
        raise _does_not_compile(structured, str(error)) from None
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        raise _does_not_compile(structured, matcher.get_error())
    return matcher


def _grammar_of(structured: StructuredOutputsParams) -> str:
    """The constraint as llguidance's grammar text."""
    kind = structured.kind
    if kind is StructuredKind.JSON:
        return str(llguidance.LLMatcher.grammar_from_json_schema(structured.text))
    if kind is StructuredKind.JSON_OBJECT:
        # OpenAI's `json_object` is an object, not any JSON value.
        return str(llguidance.LLMatcher.grammar_from_json_schema(ANY_OBJECT_SCHEMA))
    if kind is StructuredKind.REGEX:
        return str(llguidance.LLMatcher.grammar_from_regex(structured.text))
    if kind is StructuredKind.GRAMMAR:
        # Lark as is; GBNF (`root ::= ...`) converted, as vLLM's guidance backend does.
        return str(llguidance.LLMatcher.grammar_from_lark(any_to_lark(structured.text)))
    assert structured.choice is not None  # the one kind left
    options = " | ".join(json.dumps(option, ensure_ascii=False) for option in structured.choice)
    return str(llguidance.LLMatcher.grammar_from_lark(f"start: {options}"))


def _does_not_compile(structured: StructuredOutputsParams, problem: str) -> InvalidRequestError:
    flat = " ".join(problem.split())[:MAX_ERROR_CHARS]
    return InvalidRequestError(_field(structured), f"does not compile: {flat}")


def _field(structured: StructuredOutputsParams) -> str:
    return f"sampling.structured.{structured.kind.value}"
