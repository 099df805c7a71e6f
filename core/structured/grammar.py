"""A worker's grammars: each request's constraint compiled against the tokenizer (xgrammar), cached
by constraint, and the per-request matcher that says which tokens may come next.

Why xgrammar (docs/structured_outputs.md has the run): on this CPU its mask for the next token
takes about 10 us against llguidance's 130 us, and compiles a nested schema in 12 ms against
outlines-core's 110 ms (which knows no grammars beyond regexes); it also rolls back, which
speculative drafts need, and is vLLM's and SGLang's default.

Compiling may take long for a pathological schema and holds no engine lock, so the serving path
compiles on this object's own threads (`prepare`, bounded by `compile_timeout_s`) before the
request reaches the engine thread, which then finds it compiled. The offline API compiles on the
caller's thread (`state_for`), as nothing else waits on it there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.core.structured.params import StructuredKind, StructuredOutputsParams

COMPILE_TIMEOUT_S = 10.0
MAX_CACHED_GRAMMARS = 256
COMPILE_THREADS = 2  # one pathological schema never holds up every other compile
MAX_ERROR_CHARS = 300
ANY_OBJECT_SCHEMA = '{"type": "object"}'

_Key = tuple[StructuredKind, str]
# xgrammar's messages start with a time and its C++ source line: "[08:47:46] /x/y.cc:83: ".
_XGRAMMAR_SOURCE = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class GrammarState:
    """One request's place in its grammar: it has accepted exactly the request's output tokens
    (the engine advances it with each token it appends, and a resumed request's by its resumed
    output), so the mask it fills is the set of tokens allowed next."""

    __slots__ = ("_matcher", "num_accepted")

    def __init__(self, compiled: xgrammar.CompiledGrammar) -> None:
        self._matcher = xgrammar.GrammarMatcher(compiled)
        self.num_accepted = 0  # tokens it has accepted (and not rolled back)

    def advance(self, token: int) -> bool:
        """Accepts `token`; False (and unchanged) if the grammar does not allow it here."""
        accepted = bool(self._matcher.accept_token(token))
        self.num_accepted += accepted
        return accepted

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
        if num_tokens:
            self._matcher.rollback(num_tokens)
            self.num_accepted -= num_tokens

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        """Writes the tokens allowed next into row `row` of an `allocate_bitmask` tensor."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def terminated(self) -> bool:
        """Whether the output is complete (a stop token was accepted where the grammar ends)."""
        return bool(self._matcher.is_terminated())


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
    bitmask = xgrammar.allocate_token_bitmask(logits.shape[0], logits.shape[-1])
    rows: list[int] = []
    for entry in constrained:
        grammar = entry.grammar
        for offset in range(len(entry.drafts) + 1):
            grammar.fill_mask(bitmask, entry.first_row + offset)
            rows.append(entry.first_row + offset)
            if offset < len(entry.drafts):
                advanced = grammar.advance(entry.drafts[offset])
                assert advanced, "drafts are cut where the grammar refuses one"
        grammar.rollback(len(entry.drafts))
    xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1], indices=rows)
    return len(rows)


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
        self._stop_token_ids = list(stop_token_ids)
        self.compile_timeout_s = compile_timeout_s
        self._lock = threading.Lock()  # the cache and the pending compiles
        self._compiler_lock = threading.Lock()
        self._compiler: xgrammar.GrammarCompiler | None = None  # built on first use (~0.3 s)
        self._cached: OrderedDict[_Key, xgrammar.CompiledGrammar] = OrderedDict()
        self._pending: dict[_Key, concurrent.futures.Future[xgrammar.CompiledGrammar]] = {}
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
        state = GrammarState(self.compiled(structured))
        self.num_requests += 1
        return state

    def mask(self, logits: torch.Tensor, constrained: Sequence[ConstrainedRows]) -> None:
        """`mask_logits`, timed."""
        if not constrained:
            return
        started = time.perf_counter()
        self.num_masked_rows += mask_logits(logits, constrained)
        self.mask_seconds += time.perf_counter() - started

    def compiled(self, structured: StructuredOutputsParams) -> xgrammar.CompiledGrammar:
        """The compiled constraint (compiled here if nothing has yet); raises
        InvalidRequestError naming the field if it does not compile."""
        return self._compile_soon(structured).result()

    def _compile_soon(
        self, structured: StructuredOutputsParams
    ) -> concurrent.futures.Future[xgrammar.CompiledGrammar]:
        key = (structured.kind, structured.text)
        with self._lock:
            cached = self._cached.get(key)
            if cached is not None:
                self._cached.move_to_end(key)
                done: concurrent.futures.Future[xgrammar.CompiledGrammar] = (
                    concurrent.futures.Future()
                )
                done.set_result(cached)
                return done
            pending = self._pending.get(key)
            if pending is None:
                pending = self._threads.submit(self._compile, key, structured)
                self._pending[key] = pending
            return pending

    def _compile(self, key: _Key, structured: StructuredOutputsParams) -> xgrammar.CompiledGrammar:
        started = time.perf_counter()
        try:
            compiled = _compile_with(self._the_compiler(), structured)
        except InvalidRequestError:
            raise
        except Exception as error:  # xgrammar's own errors: the message says what is wrong
            problem = _XGRAMMAR_SOURCE.sub("", " ".join(str(error).split()))[:MAX_ERROR_CHARS]
            raise InvalidRequestError(_field(structured), f"does not compile: {problem}") from None
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

    def _the_compiler(self) -> xgrammar.GrammarCompiler:
        with self._compiler_lock:
            if self._compiler is None:
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer,
                    vocab_size=self._vocab_size,
                    stop_token_ids=self._stop_token_ids,
                )
                self._compiler = xgrammar.GrammarCompiler(info, max_threads=COMPILE_THREADS)
            return self._compiler


def _compile_with(
    compiler: xgrammar.GrammarCompiler, structured: StructuredOutputsParams
) -> xgrammar.CompiledGrammar:
    kind = structured.kind
    if kind is StructuredKind.JSON:
        return compiler.compile_json_schema(structured.text)
    if kind is StructuredKind.JSON_OBJECT:
        # OpenAI's `json_object` is an object; xgrammar's builtin JSON grammar takes any value.
        return compiler.compile_json_schema(ANY_OBJECT_SCHEMA)
    if kind is StructuredKind.REGEX:
        return compiler.compile_regex(structured.text)
    if kind is StructuredKind.GRAMMAR:
        text = structured.text
        # EBNF rules read `name ::= ...`; Lark's `name: ...` (vLLM tells them apart the same way).
        return compiler.compile_grammar(text) if "::=" in text else compiler.compile_lark(text)
    assert structured.choice is not None  # the one kind left
    options = " | ".join(json.dumps(option, ensure_ascii=False) for option in structured.choice)
    return compiler.compile_grammar(f"root ::= {options}")


def _field(structured: StructuredOutputsParams) -> str:
    return f"sampling.structured.{structured.kind.value}"
