"""A model-free engine loop for property tests: the scheduler's plans run against fake KV memory.

`FakeRunner` stands in for ModelRunner. Every slot of every device and swap block records whose KV
it holds, as a key of the tokens up to and including its position (KV at a position depends on
exactly those), so a block reused from the prefix cache passes only if its prefix is the reader's.
A step applies the plan in the runner's order: all swap-out copies, then all swap-in copies, then
the forward, which writes the KV of every scheduled token and then lets every scheduled request
read positions 0 .. start + num_new - 1 through its block table (write_kv runs before attention in
every layer, so all writes precede all reads); with a sliding window W only those from
start - W + 1 on, the positions its first query can see. A read that does not find the request's
own KV means a block was lost, wrongly shared or overwritten.

`Simulation` drives a scheduler the way LLMEngine does: arrivals and aborts between steps, then
schedule, run, `record_computed`, one sampled token for each request that caught up, and
a finish on max_tokens (or on a scripted stop token). The invariants live in the tests.

With a `speculator` the real `Speculator` drafts before each step from `ScriptedProposer`: the
true next tokens (output token i is i) with one wrong token at a random place, so every number
of drafts kept happens. The forward writes the drafts' KV too (keyed by the drafted tokens, so
a rejected draft's KV differs from the true token's), the verification keeps the drafts up to
the first wrong one plus the true next token, as `LLMEngine._append_verified` does, and
`record_verified` rolls back the rest. A later read of a rejected draft's KV, by the request or
by another through the prefix cache, fails its step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.kv.sliding_window import first_visible_position
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import DEFAULT_TENANT, SamplingParams, sample_ids
from pdserve.core.sched.scheduler import Scheduler, SchedulerOutput
from pdserve.core.spec.speculator import Speculator

SlotKV = int | None  # prefix_keys()[position] of the KV a slot holds; None: never written
SHARED_TOKEN = 10**6  # prompts' shared prefixes are made of these, own tokens of order * 1000 + i


class KVMismatchError(AssertionError):
    """A request read KV that is not its own: a lost swap, a shared block or a stale block."""


class FakeRunner:
    def __init__(self, config: EngineConfig, sliding_window: int | None = None) -> None:
        self.block_size = config.block_size
        self.sliding_window = sliding_window
        self.device: list[list[SlotKV]] = _blocks(config.num_kv_blocks, config.block_size)
        self.swap: list[list[SlotKV]] = _blocks(config.num_swap_blocks, config.block_size)

    def execute(self, output: SchedulerOutput, chunks: Sequence[Chunk]) -> None:
        """Runs one plan: the copies, then the forward's KV writes, then its reads."""
        self._copy(output.swap_out, self.device, self.swap)
        self._copy(output.copies, self.device, self.device)
        self._copy(output.swap_in, self.swap, self.device)
        for chunk in chunks:
            request, end = chunk.request, chunk.start + chunk.num_new
            needed = blocks_for(end, self.block_size)
            if len(request.block_ids) < needed:
                raise AssertionError(
                    f"request {request.request_id} scheduled up to {end} tokens "
                    f"with {len(request.block_ids)} blocks, needs {needed}"
                )
            keys = prefix_keys(request, chunk.drafts)
            for position in range(chunk.start, end):
                self._set(self.device, request.block_ids, position, keys[position])
        for chunk in chunks:
            end = chunk.start + chunk.num_new
            request = chunk.request
            # A sliding window's queries read from the first one's window on (the kernels too).
            first = first_visible_position(chunk.start, self.sliding_window)
            self.check_holds(self.device, request, request.block_ids, end, chunk.drafts, first)

    def check_holds(
        self,
        memory: list[list[SlotKV]],
        request: Request,
        block_ids: list[int],
        num_positions: int,
        drafts: Sequence[int] = (),
        first: int = 0,
    ) -> None:
        """Positions first .. num_positions - 1 of `request` (its tokens, then `drafts`), read
        through `block_ids`, are its own."""
        keys = prefix_keys(request, drafts)
        for position in range(first, num_positions):
            block = block_ids[position // self.block_size]
            found = memory[block][position % self.block_size]
            if found != keys[position]:
                raise KVMismatchError(
                    f"request {request.request_id} position {position} in block {block} "
                    f"holds {found}"
                )

    def _copy(
        self, pairs: Sequence[tuple[int, int]], src: list[list[SlotKV]], dst: list[list[SlotKV]]
    ) -> None:
        if pairs and not (self.swap or src is dst):
            raise RuntimeError("scheduler asked for a swap but the engine has no swap space")
        # copy_blocks gathers every source before it scatters, like this snapshot.
        data = [list(src[src_id]) for src_id, _ in pairs]
        for (_, dst_id), blocks in zip(pairs, data, strict=True):
            dst[dst_id] = blocks

    def _set(self, memory: list[list[SlotKV]], ids: list[int], position: int, kv: SlotKV) -> None:
        memory[ids[position // self.block_size]][position % self.block_size] = kv


def prefix_keys(request: Request, drafts: Sequence[int] = ()) -> list[int]:
    """One key per position, equal for two requests exactly when their tokens up to it are."""
    keys, key = [], 0
    for token in [*request.all_token_ids, *drafts]:
        key = hash((key, token))
        keys.append(key)
    return keys


def _blocks(count: int, block_size: int) -> list[list[SlotKV]]:
    return [[None] * block_size for _ in range(count)]


@dataclass(frozen=True)
class Arrival:
    """One scripted request: when it arrives, how long it is, how it ends."""

    step: int
    prompt_len: int
    max_tokens: int
    priority: int = 0
    stop_after: int | None = None  # a stop token is sampled as output token number `stop_after`
    abort_after: int | None = None  # aborted this many steps after arriving (between steps)
    shared_prefix: int = 0  # leading prompt tokens every request with this field shares
    n: int = 1  # samples, as SamplingParams.n: sample ids are "<order>/<index>"
    tenant: str = DEFAULT_TENANT
    tenant_weight: float = 1.0

    def prompt(self, order: int) -> list[int]:
        shared = min(self.shared_prefix, self.prompt_len)
        own = range(self.prompt_len - shared)
        return [SHARED_TOKEN + i for i in range(shared)] + [order * 1000 + i for i in own]


@dataclass(frozen=True)
class Finish:
    status: RequestStatus
    num_output_tokens: int
    step: int


@dataclass(frozen=True)
class Chunk:
    """One request's share of a step, as it stood when the plan was made."""

    request: Request
    start: int  # num_computed_tokens before the step
    num_new: int
    num_tokens: int  # prompt + output before the step
    drafts: tuple[int, ...] = ()  # verified after its last token, the last of its num_new

    @property
    def completes(self) -> bool:
        """Whether the request catches up this step, so its next token is sampled."""
        return self.start + self.num_new == self.num_tokens + len(self.drafts)


class ScriptedProposer:
    """Drafts the true next tokens (output token i is i) with one of them wrong, at a random
    place or nowhere."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int]) -> list[list[int]]:
        drafts = []
        for request, limit in zip(requests, max_drafts, strict=True):
            first = len(request.output_token_ids)
            tokens = list(range(first, first + limit))
            wrong = self.rng.randrange(limit + 1)
            if wrong < limit:
                tokens[wrong] = -1
            drafts.append(tokens)
        return drafts


@dataclass(frozen=True)
class StepRecord:
    """What one step started from and planned: the input of the per-step checks."""

    running_before: tuple[Request, ...]
    running_after: tuple[Request, ...]  # right after schedule(), before any request finished
    output: SchedulerOutput
    chunks: tuple[Chunk, ...]


class Simulation:
    def __init__(
        self,
        config: EngineConfig,
        arrivals: Sequence[Arrival],
        scheduler_class: type[Scheduler] = Scheduler,
        speculator: Speculator | None = None,
        sliding_window: int | None = None,
    ) -> None:
        self.config = config
        self.speculator = speculator
        self.arrivals = list(arrivals)
        self.scheduler = scheduler_class(config, sliding_window)
        self.runner = FakeRunner(config, sliding_window)
        self.requests: dict[str, Request] = {}  # arrived and unfinished, by id
        self.all_requests: dict[str, Request] = {}
        self.finished: dict[str, Finish] = {}
        self.steps: list[StepRecord] = []

    @property
    def step_index(self) -> int:
        return len(self.steps)

    def has_work(self) -> bool:
        last_arrival = max((arrival.step for arrival in self.arrivals), default=-1)
        return self.step_index <= last_arrival or self.scheduler.has_unfinished()

    def step(self) -> StepRecord:
        self._arrive_and_abort()
        running_before = tuple(self.scheduler.running)
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        output = self.scheduler.schedule()
        chunks = tuple(
            Chunk(
                request,
                request.num_computed_tokens,
                num_new,
                request.num_tokens,
                output.draft_token_ids.get(request.request_id, ()),
            )
            for request, num_new in (
                (self.requests[rid], num_new)
                for rid, num_new in output.num_scheduled_tokens.items()
            )
        )
        record = StepRecord(running_before, tuple(self.scheduler.running), output, chunks)
        self.runner.execute(output, chunks)
        for chunk in chunks:
            if not chunk.drafts:
                self.scheduler.record_computed(chunk.request, chunk.num_new)
        for chunk in chunks:
            if chunk.drafts:
                self._append_verified(chunk)
            elif chunk.completes:
                self._append_sampled(chunk.request)
        self.steps.append(record)
        return record

    def _append_verified(self, chunk: Chunk) -> None:
        """The drafts up to the first wrong one and the true next token join the output one at
        a time until one ends the request; KV is kept for one slot per token emitted."""
        request = chunk.request
        first = len(request.output_token_ids)
        kept = 0
        while kept < len(chunk.drafts) and chunk.drafts[kept] == first + kept:
            kept += 1
        assert self.speculator is not None
        self.speculator.record(request, len(chunk.drafts), kept)
        status: RequestStatus | None = None
        for _ in range(kept + 1):
            status = self._sample_one(request)
            if status is not None:
                break
        self.scheduler.record_verified(request, len(request.output_token_ids) - first)
        if status is not None:
            self._finish(request, status)

    def arrival_of(self, request: Request) -> Arrival:
        order: int = request.arrival_order
        return self.arrivals[order]

    def _arrive_and_abort(self) -> None:
        for order, arrival in enumerate(self.arrivals):
            request_id = str(order)
            if arrival.step == self.step_index:
                self._arrive(order, arrival)
            if arrival.abort_after is not None and arrival.step + arrival.abort_after == (
                self.step_index
            ):
                for sample_id in sample_ids(request_id, arrival.n):
                    if sample_id in self.requests:
                        self._finish(self.requests[sample_id], RequestStatus.FINISHED_ABORTED)

    def _arrive(self, order: int, arrival: Arrival) -> None:
        """Queues the samples as LLMEngine.add_request does: the first one leads, others fork."""
        params = SamplingParams(
            max_tokens=arrival.max_tokens,
            priority=arrival.priority,
            n=arrival.n,
            tenant=arrival.tenant,
            tenant_weight=arrival.tenant_weight,
        )
        samples = []
        for index, sample_id in enumerate(sample_ids(str(order), arrival.n)):
            prompt = arrival.prompt(order)
            request = Request(
                sample_id, prompt, params.for_sample(index), order, float(arrival.step)
            )
            request.sample_index = index
            self.requests[sample_id] = self.all_requests[sample_id] = request
            samples.append(request)
        if arrival.prompt_len > 1 and self.scheduler.forks_samples:
            samples[0].forks, samples = samples[1:], samples[:1]
        for request in samples:
            self.scheduler.add(request)

    def _append_sampled(self, request: Request) -> None:
        status = self._sample_one(request)
        if status is not None:
            self._finish(request, status)

    def _sample_one(self, request: Request) -> RequestStatus | None:
        """Appends the true next token; the status it ends the request with, if any."""
        arrival = self.arrival_of(request)
        request.output_token_ids.append(len(request.output_token_ids))
        num_output = len(request.output_token_ids)
        if num_output == arrival.stop_after:
            return RequestStatus.FINISHED_STOPPED
        if num_output >= arrival.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request.request_id in self.finished:
            raise AssertionError(f"request {request.request_id} finished twice")
        pending = list(request.forks)
        self.scheduler.finish(request, status)
        for fork in pending:  # never forked: they finish with their leader
            assert fork.status is status
            del self.requests[fork.request_id]
            self.finished[fork.request_id] = Finish(status, 0, self.step_index)
        assert request.status is status
        assert not request.block_ids and not request.swap_block_ids
        del self.requests[request.request_id]
        self.finished[request.request_id] = Finish(
            status, len(request.output_token_ids), self.step_index
        )
