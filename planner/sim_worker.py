"""One simulated engine: pdserve's real `Scheduler`, KV-cache manager and reservation queue over a
model whose step time comes from the profile.

The worker runs the loop a real worker's `EngineLoop` runs: between steps it takes the commands
that arrived during the step (new prompts, decode reservations, KV hand-offs), polls its background
work (decode: grant queued reservations, admit requests whose KV landed), then schedules the next
step, whose end is an event `profile.step_seconds(shape)` later. At the step's end, as in
`LLMEngine.step`, every scheduled request catches up by its tokens and each that caught up gets one
token. A request prefilled for another worker ends at its first token (its KV ships); one run
here end to end (any decode worker's, and a prefill worker's the router lent streams) at its output
length.

Everything that decides (scheduling, blocks, prefix cache, the reservation queue) is the engine's
own code from `core/`; this module only moves time and tokens. Prompts are made of token ids that
no other prompt has (`prompt_token_ids`) except for the prefix a request shares by its trace's
`prefix_id`, so prefix caches hit exactly where the workload says prompts repeat.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.kv.manager import KVCacheManager
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.engine_load import EngineLoad, load_of
from pdserve.core.sched.reservation_queue import ReservationQueue
from pdserve.core.sched.scheduler import Scheduler, SchedulerOutput
from pdserve.costmodel.profile import Profile
from pdserve.costmodel.step_shape import StepShape
from pdserve.planner.workload import TraceRequest

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
    prefix_id: int | None = None  # requests with the same one share their first prefix_tokens
    prefix_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    num_cached_blocks: int = 0  # decode held these at Reserve: prefill gathers and sends the rest
    refused: bool = False  # by the router's SLO admission, on arrival
    predicted_ttft_s: float | None = None  # the admission's prediction, when it judged it

    @classmethod
    def of(cls, index: int, request: TraceRequest) -> Journey:
        return cls(
            index,
            request.arrival_s,
            request.prompt_tokens,
            request.output_tokens,
            request.prefix_id,
            request.prefix_tokens,
        )

    @property
    def request_id(self) -> str:
        return str(self.index)


# Far apart, so that no two runs of ids overlap: a request's own tokens count up from
# (index + 1) * SPACING, a shared prefix's from -(prefix_id + 1) * SPACING.
SPACING = 1 << 32


def prompt_token_ids(journey: Journey) -> list[int]:
    """The journey's prompt: its prefix group's tokens, then tokens no other prompt has. They are
    not a model's token ids: the simulator only hashes them into prefix-cache blocks."""
    own_start = (journey.index + 1) * SPACING
    own = range(own_start, own_start + journey.prompt_tokens - journey.prefix_tokens)
    if journey.prefix_id is None:
        return list(own)
    prefix_start = -(journey.prefix_id + 1) * SPACING
    return [*range(prefix_start, prefix_start + journey.prefix_tokens), *own]


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
class _Reservation:
    request: Request
    granted: Callable[[float], None]  # the router's callback: the reservation stands


@dataclass(frozen=True)
class UsageSample:
    time: float
    worker: str
    kv_used: float  # fraction of device blocks in use
    waiting: int  # requests queued here: not yet running (reservations included)
    running: int


class SharedCore:
    """Workers pinned to one core (planner/real_runs.py pins each tier's to one): the kernel
    shares it among the processes that run, and an idle one takes nothing. A step is priced at
    1 / (the core's workers stepping when it starts, itself included) of the core: alone, the
    whole of it. An even split instead predicted the TTFT of two prefill workers on one core,
    rarely busy at once at 1-3 req/s, 40-63 % high (docs/planning.md, "Fidelity"). A step does
    not slow down when another starts after it: an approximation, steps being short beside the
    gaps between them at such rates."""

    def __init__(self) -> None:
        self.stepping = 0


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
        core: SharedCore | None = None,
    ) -> None:
        self.name, self.role, self.config, self.profile = name, role, config, profile
        self.scheduler = scheduler_class(config)
        self.kv_manager: KVCacheManager = self.scheduler.kv_manager
        self._at = at
        self._share = share  # of the profiled device: step times are divided by it
        self._core = core  # shared with other workers (None: a core, or a quota, of its own)
        self.journeys: dict[str, Journey] = {}
        self.requests: dict[str, Request] = {}
        self._commands: list[Callable[[float], None]] = []
        self._reservations = ReservationQueue[_Reservation](self.scheduler)  # decode: no blocks
        self._reserved: dict[str, Request] = {}  # decode: blocks held, KV not yet here
        self._landed: list[str] = []  # decode: KV here, admitted at the next loop turn
        self._ships: set[str] = set()  # prefilled for another worker: done at the first token
        self._arriving: dict[str, int] = {}  # prompts posted, not yet taken: their lengths
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

    def add_prompt(
        self, now: float, journey: Journey, granted: Callable[[float], None], ships: bool = False
    ) -> None:
        """A prompt to run here from token 0: prefill's Prefill (`ships`: its KV goes to another
        worker at its first token), or a request run here end to end (GenerateLocal)."""
        if ships:
            self._ships.add(journey.request_id)
        self._arriving[journey.request_id] = journey.prompt_tokens
        self._post(now, lambda at: self._add(journey, at, granted))

    def reserve(self, now: float, journey: Journey, granted: Callable[[float], None]) -> None:
        """Decode.Reserve: blocks for the prompt's KV, at once or when they free up."""
        self._post(now, lambda at: self._queue_reservation(journey, granted))

    def kv_landed(self, now: float, journey: Journey) -> None:
        """Decode.Generate arrived and the KV is in: the request joins at the next loop turn."""
        self._post(now, lambda at: self._landed.append(journey.request_id))

    def engine_load(self) -> EngineLoad:
        """What this worker's Load would report (reservations count as waiting, as on decode),
        with the prompts already sent to it: the router counts those too."""
        load = load_of(self.scheduler)
        queued = len(self._reservations) + len(self._reserved) + len(self._arriving)
        return dataclasses.replace(
            load,
            num_waiting=load.num_waiting + queued,
            num_pending_prompt_tokens=load.num_pending_prompt_tokens + sum(self._arriving.values()),
        )

    def load(self) -> tuple[int, int, float]:
        """The router's least-loaded key: (queued, running, KV fraction in use)."""
        usage = self.kv_manager.usage()
        queued = len(self._reservations) + len(self._reserved) + len(self.scheduler.waiting)
        running = len(self.scheduler.running) + len(self.scheduler.swapped)
        return queued, running, usage.fraction_used

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
        self._reservations.grant(lambda reservation: self._granted(reservation, now))
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
            self._chunk(self.requests[rid], n) for rid, n in output.num_scheduled_tokens.items()
        ]
        shape = StepShape.of([(chunk.start, chunk.num_new) for chunk in chunks])
        seconds = self.profile.step_seconds(shape, len(output.swap_out) + len(output.swap_in))
        if self._ships:  # the KV of finished prompts is gathered on this thread
            shipped = sum(
                self._blocks_to_send(c.request)
                for c in chunks
                if c.completes and c.request.request_id in self._ships
            )
            seconds += shipped * self.profile.blocks.gather_s
        if self._core is not None:
            self._core.stepping += 1
            seconds *= self._core.stepping
        seconds /= self._share
        self._record_usage(now)
        self._busy = True
        self.num_steps += 1
        self._at(now + seconds, lambda end: self._end_step(chunks, end))

    @staticmethod
    def _chunk(request: Request, num_new: int) -> Chunk:
        return Chunk(request, request.num_computed_tokens, num_new, request.num_tokens)

    def _blocks_to_send(self, request: Request) -> int:
        """A prefilled prompt's blocks but those its decode worker holds already."""
        journey = self.journeys[request.request_id]
        return blocks_for(request.num_tokens, self.config.block_size) - journey.num_cached_blocks

    def _end_step(self, chunks: list[Chunk], now: float) -> None:
        for chunk in chunks:
            self.scheduler.record_computed(chunk.request, chunk.num_new)  # as LLMEngine.step
        for chunk in chunks:
            if chunk.completes:
                self._append_token(chunk.request, now)
        self._busy = False
        if self._core is not None:
            self._core.stepping -= 1
        self._turn(now)

    # -- requests -------------------------------------------------------------------------

    def _add(self, journey: Journey, now: float, granted: Callable[[float], None]) -> None:
        del self._arriving[journey.request_id]
        request = self._new_request(journey)
        self.scheduler.add(request)
        granted(now)

    def _new_request(self, journey: Journey) -> Request:
        params = SamplingParams(max_tokens=journey.output_tokens, ignore_eos=True)
        prompt = prompt_token_ids(journey)
        request = Request(journey.request_id, prompt, params, journey.index, journey.arrival_s)
        self.journeys[journey.request_id] = journey
        self.requests[journey.request_id] = request
        return request

    def _queue_reservation(self, journey: Journey, granted: Callable[[float], None]) -> None:
        self._reservations.append(_Reservation(self._new_request(journey), granted))

    def _granted(self, reservation: _Reservation, now: float) -> bool:
        """As DecodeEngine's posted receive: the blocks are held; the router hears at once."""
        request = reservation.request
        num_cached = request.num_computed_tokens // self.config.block_size
        self.journeys[request.request_id].num_cached_blocks = num_cached
        self._reserved[request.request_id] = request
        reservation.granted(now)
        return True

    def _admit(self, request_id: str, now: float) -> None:
        """As DecodeEngine._admit: the prompt is computed; prefill's token is the first output."""
        request = self._reserved.pop(request_id)
        self._reservations.kv_landed(request)
        self._append_token(request, now)
        if request.request_id in self.requests:
            self.scheduler.add(request)

    def _append_token(self, request: Request, now: float) -> None:
        journey = self.journeys[request.request_id]
        request.output_token_ids.append(0)
        if request.request_id in self._ships:
            self._ships.discard(request.request_id)
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
