"""One simulated engine: pdserve's real `Scheduler` and block pools over a model whose step time
comes from the profile.

The worker runs the loop a real worker's `EngineLoop` runs: between steps it takes the commands
that arrived during the step (new prompts, decode reservations, KV hand-offs), polls its background
work (decode: grant queued reservations, admit requests whose KV landed), then schedules the next
step, whose end is an event `profile.step_seconds(shape)` later. At the step's end, as in
`LLMEngine.step`, every scheduled request catches up by its tokens and each that caught up gets one
token. A prefill worker's request ends at its first token (its KV ships); a decode worker's at its
output length.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pdserve.core.config import EngineConfig
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerOutput, blocks_for
from pdserve.planner.profile import Profile, StepShape

Schedule = Callable[[float, Callable[[float], None]], None]  # (at, action(now))


class Role(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass
class Journey:
    """One request's times through the simulated cluster."""

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    token_times: list[float] = field(default_factory=list)

    @property
    def request_id(self) -> str:
        return str(self.index)


@dataclass(frozen=True)
class Chunk:
    request: Request
    start: int
    num_new: int
    num_tokens: int

    @property
    def completes(self) -> bool:
        return self.start + self.num_new == self.num_tokens


@dataclass(frozen=True)
class UsageSample:
    time: float
    worker: str
    kv_used: float  # fraction of device blocks in use
    waiting: int  # requests queued here: not yet running (reservations included)
    running: int


class SimWorker:
    def __init__(
        self,
        name: str,
        role: Role,
        config: EngineConfig,
        profile: Profile,
        at: Schedule,
        scheduler_class: type[Scheduler] = Scheduler,
        share: float = 1.0,
        usage_interval_s: float = 1.0,
    ) -> None:
        self.name, self.role, self.config, self.profile = name, role, config, profile
        self.scheduler = scheduler_class(config)
        self._at = at
        self._share = share  # of the profiled device: step times are divided by it
        self.journeys: dict[str, Journey] = {}
        self.requests: dict[str, Request] = {}
        self._commands: list[Callable[[float], None]] = []
        self._reservations: deque[Request] = deque()  # decode: waiting for blocks
        self._reserved: dict[str, Request] = {}  # decode: blocks held, KV not yet here
        self._landed: list[str] = []  # decode: KV here, admitted at the next loop turn
        self._grants: dict[str, Callable[[float], None]] = {}  # reservation -> router's callback
        self._busy = False
        self._turn_pending = False
        self.num_steps = 0
        self.outputs: list[SchedulerOutput] = []  # kept only when record_outputs is set
        self.record_outputs = False
        self.usage: list[UsageSample] = []  # at most one sample per usage_interval_s
        self._usage_interval_s = usage_interval_s
        self._next_usage = 0.0
        self.on_prefilled: Callable[[Journey, float], None] = lambda journey, now: None
        self.on_finished: Callable[[Journey], None] = lambda journey: None

    # -- what the router sends (each runs at the worker's next loop turn) ---------------------

    def add_prompt(self, now: float, journey: Journey, granted: Callable[[float], None]) -> None:
        """A prompt to run here from token 0: prefill's Prefill, or a colocated Generate."""
        self._post(now, lambda at: self._add(journey, at, granted))

    def reserve(self, now: float, journey: Journey, granted: Callable[[float], None]) -> None:
        """Decode.Reserve: blocks for the prompt's KV, at once or when they free up."""
        self._post(now, lambda at: self._queue_reservation(journey, granted))

    def kv_landed(self, now: float, journey: Journey) -> None:
        """Decode.Generate arrived and the KV is in: the request joins at the next loop turn."""
        self._post(now, lambda at: self._landed.append(journey.request_id))

    def load(self) -> tuple[int, int, float]:
        """The router's least-loaded key: (queued, running, KV fraction in use)."""
        pool = self.scheduler.block_pool
        queued = len(self._reservations) + len(self._reserved) + len(self.scheduler.waiting)
        running = len(self.scheduler.running) + len(self.scheduler.swapped)
        return queued, running, pool.num_used / pool.num_blocks

    # -- the loop -------------------------------------------------------------------------

    def _post(self, now: float, command: Callable[[float], None]) -> None:
        """Queues a command; an idle worker takes it in a loop turn of its own, after everything
        else that happens at this instant (a burst of arrivals at t lands in one step)."""
        self._commands.append(command)
        if not (self._busy or self._turn_pending):
            self._turn_pending = True
            self._at(now, self._turn)

    def _turn(self, now: float) -> None:
        self._turn_pending = False
        commands, self._commands = self._commands, []
        for command in commands:
            command(now)
        self._grant_reservations(now)
        for request_id in self._landed:
            self._admit(request_id, now)
        self._landed = []
        if self.scheduler.has_unfinished():
            self._start_step(now)

    def _start_step(self, now: float) -> None:
        output = self.scheduler.schedule()
        if self.record_outputs:
            self.outputs.append(output)
        chunks = [
            Chunk(self.requests[rid], self.requests[rid].num_computed_tokens, n,
                  self.requests[rid].num_tokens)
            for rid, n in output.num_scheduled_tokens.items()
        ]  # fmt: skip
        shape = StepShape.of([(chunk.start, chunk.num_new) for chunk in chunks])
        seconds = self.profile.step_seconds(shape, len(output.swap_out) + len(output.swap_in))
        if self.role is Role.PREFILL:  # the KV of finished prompts is gathered on this thread
            shipped = sum(blocks_for(c.num_tokens, self.config.block_size) for c in chunks
                          if c.completes)  # fmt: skip
            seconds += shipped * self.profile.blocks.gather_s
        seconds /= self._share
        self._record_usage(now)
        self._busy = True
        self.num_steps += 1
        self._at(now + seconds, lambda end: self._end_step(chunks, end))

    def _end_step(self, chunks: list[Chunk], now: float) -> None:
        for chunk in chunks:
            chunk.request.num_computed_tokens += chunk.num_new
        for chunk in chunks:
            if chunk.completes:
                self._append_token(chunk.request, now)
        self._busy = False
        self._turn(now)

    # -- requests -------------------------------------------------------------------------

    def _add(self, journey: Journey, now: float, granted: Callable[[float], None]) -> None:
        request = self._new_request(journey)
        self.scheduler.add(request)
        granted(now)

    def _new_request(self, journey: Journey) -> Request:
        params = SamplingParams(max_tokens=journey.output_tokens, ignore_eos=True)
        request = Request(journey.request_id, [0] * journey.prompt_tokens, params,
                          journey.index, journey.arrival_s)  # fmt: skip
        self.journeys[journey.request_id] = journey
        self.requests[journey.request_id] = request
        return request

    def _queue_reservation(self, journey: Journey, granted: Callable[[float], None]) -> None:
        request = self._new_request(journey)
        self._reservations.append(request)
        self._grants[request.request_id] = granted

    def _grant_reservations(self, now: float) -> None:
        """As DecodeEngine._grant_queued: preempted requests go first, then these in order."""
        while self._reservations and not (self.scheduler.swapped or self.scheduler.waiting):
            request = self._reservations[0]
            needed = blocks_for(request.num_prompt_tokens, self.config.block_size)
            block_ids = self.scheduler.block_pool.allocate(needed)
            if block_ids is None:
                return
            self._reservations.popleft()
            request.block_ids = block_ids
            request.status = RequestStatus.WAITING_FOR_KV
            self._reserved[request.request_id] = request
            self._grants.pop(request.request_id)(now)

    def _admit(self, request_id: str, now: float) -> None:
        """As DecodeEngine._admit: the prompt is computed; prefill's token is the first output."""
        request = self._reserved.pop(request_id)
        request.num_computed_tokens = request.num_prompt_tokens
        self._append_token(request, now)
        if request.request_id in self.requests:
            self.scheduler.add(request)

    def _append_token(self, request: Request, now: float) -> None:
        journey = self.journeys[request.request_id]
        request.output_token_ids.append(0)
        if self.role is Role.PREFILL:
            self._forget(request)
            self.scheduler.finish(request, RequestStatus.FINISHED_LENGTH)
            self.on_prefilled(journey, now)
            return
        journey.token_times.append(now)
        if len(request.output_token_ids) >= journey.output_tokens:
            self._forget(request)
            self.scheduler.finish(request, RequestStatus.FINISHED_LENGTH)
            self.on_finished(journey)

    def _forget(self, request: Request) -> None:
        del self.requests[request.request_id], self.journeys[request.request_id]

    def _record_usage(self, now: float) -> None:
        if now < self._next_usage:
            return
        self._next_usage = now + self._usage_interval_s
        queued, running, used = self.load()
        self.usage.append(UsageSample(now, self.name, used, queued, running))
