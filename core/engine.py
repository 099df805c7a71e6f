"""The in-process engine: validate, schedule, run, sample, stream deltas.

One thread drives `step()`; everything else (adding, aborting) happens between steps.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from pdserve.core.config import EngineConfig
from pdserve.core.intake import RequestIntake
from pdserve.core.kv.block_pool import cache_root
from pdserve.core.kv.cache import DTYPES, KVCache, KVLayout
from pdserve.core.kv.offload import build_offload
from pdserve.core.model.config import ModelConfig, load_model_config
from pdserve.core.model.forward import load_model
from pdserve.core.model_runner import ModelRunner
from pdserve.core.outputs import FinishReason, TokenDelta
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampler import seeded_noise
from pdserve.core.sampling_params import (
    SAMPLE_SEPARATOR,
    DuplicateRequestError,
    InvalidRequestError,
    SamplingParams,
    sample_ids,
)
from pdserve.core.sched.engine_load import EngineLoad, load_of
from pdserve.core.sched.scheduler import Scheduler, SchedulerOutput
from pdserve.core.spec.proposer import make_proposer
from pdserve.core.spec.speculator import Speculator
from pdserve.core.structured.grammar import Grammars, GrammarState
from pdserve.core.text.detokenizer import IncrementalDetokenizer
from pdserve.core.text.tokenizer import load_tokenizer
from pdserve.costmodel.output_length import OutputLengths
from pdserve.costmodel.step_shape import StepShape

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats:
    num_waiting: int
    num_running: int
    num_swapped: int
    num_free_blocks: int
    num_total_blocks: int
    num_free_swap_blocks: int
    num_preemptions: int
    num_swaps_out: int
    num_cached_blocks: int
    num_cache_evictions: int
    num_prefix_query_tokens: int
    num_prefix_hit_tokens: int
    num_drafted_tokens: int  # speculative drafts verified since start
    num_accepted_tokens: int  # of which the target agreed with
    num_window_freed_blocks: int  # blocks given back once out of every future sliding window

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of admitted prompt tokens whose KV came from the prefix cache."""
        return self.num_prefix_hit_tokens / max(self.num_prefix_query_tokens, 1)


class LLMEngine:
    # Whether the router may move this engine's streams to another worker once this one drains
    # (live migration needs a decode worker's KV sender); a lent prefill worker's may not.
    streams_move_on_drain: ClassVar[bool] = False

    def __init__(
        self,
        model_dir: Path,
        config: EngineConfig,
        scheduler_class: type[Scheduler] = Scheduler,
    ) -> None:
        self.config = config
        self.model_config: ModelConfig = load_model_config(model_dir)
        self.tokenizer: Any = load_tokenizer(model_dir)
        device = torch.device(config.device)
        self.layout = KVLayout(
            num_layers=self.model_config.num_layers,
            num_kv_heads=self.model_config.num_kv_heads,
            head_dim=self.model_config.head_dim,
            block_size=config.block_size,
            dtype=config.kv_dtype,
        )
        model = load_model(
            model_dir, self.model_config, DTYPES[config.dtype], device, config.quantization
        )
        kv_cache = KVCache(self.layout, config.num_kv_blocks, device)
        swap = (
            KVCache(self.layout, config.num_swap_blocks, "cpu") if config.num_swap_blocks else None
        )
        if swap is not None and device.type == "cuda":
            swap.tensor = swap.tensor.pin_memory()  # async, full-speed host<->device copies
        self.grammars = Grammars(
            self.tokenizer, self.model_config.vocab_size, self.model_config.eos_token_ids
        )
        self.intake = RequestIntake(config, self.model_config, self.tokenizer, self.grammars)
        self.runner = ModelRunner(model, kv_cache, swap, self.grammars)
        self.scheduler = scheduler_class(config, self.model_config.sliding_window)
        proposer = make_proposer(config)
        self.speculator = (
            Speculator(proposer, config.num_speculative_tokens) if proposer is not None else None
        )
        self.scheduler.kv_manager.cache_root = cache_root(f"{self.model_config!r}|{self.layout!r}")
        self.offload = build_offload(config, kv_cache)
        if self.offload is not None:
            self.scheduler.kv_manager.attach_offload(self.offload)
        self.requests: dict[str, Request] = {}
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._arrivals = itertools.count()
        # What the last step ran, as the cost model prices a step (None: it swapped blocks,
        # which are priced apart): the serving loop times steps against it.
        self.last_step_shape: StepShape | None = None
        # How long this worker's streams ran (those that ended by themselves): the step budget
        # forecasts a running stream's remaining tokens from it.
        self.output_lengths = OutputLengths()

    # -- requests -------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        resumed_output: Sequence[int] = (),
    ) -> str:
        """Validates and queues a request; raises InvalidRequestError naming the bad field.

        With `params.n` > 1 its samples run as requests `sample_ids(request_id, n)`; the first
        computes the prompt and the others fork from it (see Request.forks). `resumed_output`:
        output another worker already streamed (a migration); the request continues after it
        (see `resume`).
        """
        order = next(self._arrivals)
        request_id = str(order) if request_id is None else request_id
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("sampling", "must be a SamplingParams")
        ids = sample_ids(request_id, params.n)
        if any(known in self.requests for known in {request_id, *ids}):
            raise DuplicateRequestError(request_id)
        token_ids = self.intake.prompt_token_ids(prompt)
        self.intake.check_fits(len(token_ids), params.max_tokens)
        if params.n > self.config.max_num_seqs:
            raise InvalidRequestError("n", f"{params.n} exceeds max_num_seqs")
        if params.structured_outputs is not None:
            self.grammars.compiled(params.structured_outputs)  # refused now if it does not compile
        resumed = self.intake.resumed_output(resumed_output, params)
        samples = [
            self._new_request(sample_id, token_ids, params.for_sample(index), order, index)
            for index, sample_id in enumerate(ids)
        ]
        if resumed:
            self.resume(samples[0], resumed, tokens_sampled_elsewhere=len(resumed))
        if len(token_ids) > 1 and self.scheduler.forks_samples:  # one token: nothing to share
            samples[0].forks, samples = samples[1:], samples[:1]
        for request in samples:
            self.scheduler.add(request)
        return request_id

    def _new_request(
        self, request_id: str, token_ids: list[int], params: SamplingParams, order: int, index: int
    ) -> Request:
        request = Request(request_id, list(token_ids), params, order, time.monotonic())
        request.sample_index = index
        request.noise = seeded_noise(params, 0)
        request.grammar = self._grammar_state(params)
        self.requests[request_id] = request
        self._detokenizers[request_id] = self._new_detokenizer(params)
        return request

    def _grammar_state(self, params: SamplingParams) -> GrammarState | None:
        """A fresh matcher of the request's structured constraint (None: unconstrained)."""
        if params.structured_outputs is None:
            return None
        return self.grammars.state_for(params.structured_outputs)

    def resume(self, request: Request, resumed: list[int], tokens_sampled_elsewhere: int) -> None:
        """Migration: `request` continues after `resumed`, output a lost worker already streamed.
        Its KV is computed over prompt + resumed (as after a recompute preemption); the resumed
        tokens count toward max_tokens; its seeded noise starts after the
        `tokens_sampled_elsewhere` tokens sampled before its first one here; its detokenizer has
        already seen them, so text the lost worker held back (an unfinished character, a possible
        stop string's start) comes out here, and a stop string may span the resumption point.
        The text those tokens released is not released again: the client has it."""
        request.output_token_ids = list(resumed)
        request.noise = seeded_noise(request.params, tokens_sampled_elsewhere)
        if request.grammar is not None:
            # Checked when the request came (`RequestIntake.resumed_output`); a live migration's
            # last token when it started (DecodeEngine.start).
            caught_up = request.grammar.catch_up(request.output_token_ids)
            assert caught_up, f"{request.request_id}: resumed output refused by its grammar"
        if resumed:
            self._detokenizers[request.request_id].add(list(resumed), final=False)

    def _new_detokenizer(self, params: SamplingParams) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, params.stop)

    # -- hooks for the tier engines (PrefillEngine, DecodeEngine) -------------------------------

    def _checked_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        resumed_output: Sequence[int],
    ) -> Request:
        """One request, validated as `add_request` validates one (its prompt, what fits the
        context and the pool, the resumed output), neither tracked nor scheduled yet."""
        token_ids = self.intake.prompt_token_ids(prompt_token_ids)
        self.intake.check_fits(len(token_ids), params.max_tokens)
        resumed = self.intake.resumed_output(resumed_output, params)
        request = Request(request_id, token_ids, params, next(self._arrivals), time.monotonic())
        request.output_token_ids = resumed
        request.grammar = self._grammar_state(params)
        if request.grammar is not None:
            request.grammar.catch_up(resumed)  # `RequestIntake.resumed_output` checked that it may
        return request

    def _track(self, request: Request) -> None:
        """The request is this engine's from now on: known by its id, its text detokenized."""
        self.requests[request.request_id] = request
        self._detokenizers[request.request_id] = self._new_detokenizer(request.params)

    def _forget(self, request_id: str) -> None:
        """Drops what `_track` kept (the request's blocks are the caller's business)."""
        self.requests.pop(request_id, None)
        self._detokenizers.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        """Finishes a request (all n samples of it) as aborted and frees its blocks (unknown ids
        are ignored)."""
        for sample_id in self._sample_ids_in_flight(request_id):
            request = self.requests.pop(sample_id, None)
            if request is None:
                continue  # a fork aborted with its leader below
            pending = list(request.forks)
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            del self._detokenizers[sample_id]
            for fork in pending:  # never forked: they hold nothing yet
                del self.requests[fork.request_id], self._detokenizers[fork.request_id]

    def add_local(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        resumed_output: Sequence[int] = (),
    ) -> None:
        """A request run here end to end (Decode.GenerateLocal): prefilled, then decoded."""
        self.add_request(prompt_token_ids, params, request_id, resumed_output)

    def release(self, request_id: str) -> bool:
        """Aborts the request; whether it was known here."""
        known = bool(self._sample_ids_in_flight(request_id))
        self.abort(request_id)
        return known

    def load(self) -> EngineLoad:
        return load_of(self.scheduler)

    def _sample_ids_in_flight(self, request_id: str) -> list[str]:
        if request_id in self.requests:
            return [request_id]
        prefix = request_id + SAMPLE_SEPARATOR
        return [known for known in self.requests if known.startswith(prefix)]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def close(self) -> None:
        """Stops what the engine runs outside its own thread (a tier's UCX endpoints, the KV
        disk tier's writer) before the interpreter exits: left running there, their threads can
        hang the process's exit. Tiers that override it call it last."""
        if self.offload is not None:
            self.offload.close()

    def _may_draft(self, request: Request) -> bool:
        """Whether `request` may draft (when its next step decodes): every request here; a tier
        excludes the ones it runs for another's sake."""
        return True

    # -- one step -------------------------------------------------------------------------

    def step(self) -> list[TokenDelta]:
        if self.speculator is not None:
            drafting = [r for r in self.scheduler.running if self._may_draft(r)]
            self.speculator.propose(drafting)
            _cut_drafts_to_grammar(drafting)
        output = self.scheduler.schedule()
        self.last_step_shape = self._priced_shape(output)
        now = time.monotonic()
        for request_id in output.num_scheduled_tokens:
            request = self.requests[request_id]
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
        sampled = self.runner.execute(output, self.requests, self._after_layer(output))
        drafts = output.draft_token_ids
        for request_id, num_new in output.num_scheduled_tokens.items():
            if request_id not in drafts:  # those with drafts advance by what was verified
                self.scheduler.record_computed(self.requests[request_id], num_new)
        return [
            self._append_verified(self.requests[rid], drafts[rid], tokens)
            if rid in drafts
            else self._append(self.requests[rid], tokens[0])
            for rid, tokens in sampled.items()
        ]

    def _priced_shape(self, output: SchedulerOutput) -> StepShape | None:
        if output.swap_out or output.swap_in:
            return None
        scheduled = output.num_scheduled_tokens.items()
        return StepShape.of([(self.requests[rid].num_computed_tokens, n) for rid, n in scheduled])

    def _after_layer(self, output: SchedulerOutput) -> Callable[[int], None] | None:
        """What the forward pass calls after each layer wrote its K/V (none here; the prefill
        engine pushes finished prompts' KV layer by layer)."""
        return None

    def _append(self, request: Request, token: int) -> TokenDelta:
        request.output_token_ids.append(token)
        status, text = self._check_stop(request, token)
        return self._deliver(request, (token,), text, status)

    def _append_verified(
        self, request: Request, drafts: tuple[int, ...], tokens: list[int]
    ) -> TokenDelta:
        """A step verified `drafts`: `tokens` are the drafts kept and the target's next token.
        They join the output one at a time until one ends the request; any after it are
        dropped, as a step without drafts would never have made them."""
        assert self.speculator is not None  # only a speculating engine schedules drafts
        self.speculator.record(request, len(drafts), len(tokens) - 1)
        emitted: list[int] = []
        text = ""
        status: RequestStatus | None = None
        for token in tokens:
            request.output_token_ids.append(token)
            emitted.append(token)
            status, piece = self._check_stop(request, token)
            text += piece
            if status is not None:
                break
        # Every emitted token but the last is a kept draft: with the token before them, one
        # KV slot per emitted token holds what the target confirmed.
        self.scheduler.record_verified(request, len(emitted))
        return self._deliver(request, tuple(emitted), text, status)

    def _check_stop(self, request: Request, token: int) -> tuple[RequestStatus | None, str]:
        """`token` was just appended: the status it ends the request with (None: goes on) and
        its text."""
        status = self._stop_status(request, token)
        if request.grammar is not None:
            status = self._grammar_status(request.request_id, request.grammar, token) or status
        detokenizer = self._detokenizers[request.request_id]
        text = detokenizer.add([token], final=status is not None)
        if detokenizer.stopped:
            status = RequestStatus.FINISHED_STOPPED
        return status, text

    def _deliver(
        self,
        request: Request,
        tokens: tuple[int, ...],
        text: str,
        status: RequestStatus | None,
    ) -> TokenDelta:
        """The delta of a step's new tokens; a request they ended is finished and forgotten."""
        if status is not None:
            self.output_lengths.record(request.params.max_tokens, len(request.output_token_ids))
            self.scheduler.finish(request, status)
            del self.requests[request.request_id], self._detokenizers[request.request_id]
        return TokenDelta(
            request.request_id, tokens, text, FinishReason.of(status) if status else None
        )

    def _grammar_status(
        self, request_id: str, grammar: GrammarState, token: int
    ) -> RequestStatus | None:
        """Advances the request's grammar by `token`: STOPPED once the output is complete."""
        if not grammar.advance(token):
            # The mask allows only what the grammar does: a refused token is a bug, and the
            # request ends rather than return output that breaks its constraint.
            log.error("request %s: token %d refused by its grammar; aborted", request_id, token)
            return RequestStatus.FINISHED_ABORTED
        return RequestStatus.FINISHED_STOPPED if grammar.terminated else None

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        params = request.params
        if token in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if not params.ignore_eos and token in self.model_config.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if len(request.output_token_ids) >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    def stats(self) -> EngineStats:
        scheduler, kv_manager = self.scheduler, self.scheduler.kv_manager
        usage = kv_manager.usage()
        return EngineStats(
            num_waiting=len(scheduler.waiting),
            num_running=len(scheduler.running),
            num_swapped=len(scheduler.swapped),
            num_free_blocks=usage.num_free_blocks,
            num_total_blocks=usage.num_blocks,
            num_free_swap_blocks=usage.num_free_swap_blocks,
            num_preemptions=scheduler.num_preemptions,
            num_swaps_out=scheduler.num_swaps_out,
            num_cached_blocks=usage.num_cached_blocks,
            num_cache_evictions=usage.num_evictions,
            num_prefix_query_tokens=kv_manager.num_prefix_query_tokens,
            num_prefix_hit_tokens=kv_manager.num_prefix_hit_tokens,
            num_drafted_tokens=self.speculator.num_drafted_tokens if self.speculator else 0,
            num_accepted_tokens=self.speculator.num_accepted_tokens if self.speculator else 0,
            num_window_freed_blocks=kv_manager.num_window_freed_blocks,
        )


def _cut_drafts_to_grammar(requests: list[Request]) -> None:
    """Drops each constrained request's drafts from the first one its grammar refuses: the
    target could never keep it, and verifying it costs a query token."""
    for request in requests:
        if request.grammar is not None and request.draft_token_ids:
            allowed = request.grammar.allowed_prefix(request.draft_token_ids)
            del request.draft_token_ids[allowed:]
