"""Adaptive placement (`--placement adaptive`): where each request is prefilled and where it
decodes, chosen by predicting what each option costs with the profiled cost model.

For a prompt of n tokens the options are

    local on W    W prefills it inside its batch, then decodes it (Decode.GenerateLocal). W is a
                  decode worker, a prefill worker already lent streams (role decode), or an
                  idle prefill worker (lending it: its role turns to decode)
    remote P->D   prefill worker P prefills it and ships the KV to decode worker D

and each is priced in seconds from the worker's live load (Load: streams running, their context,
prompt tokens queued) with the same step arithmetic the workers' SLO budgets use
(costmodel/step_budget.py: chunks of at most max_num_batched_tokens, capped under --itl-slo):

    ttft   the queued prompts ahead of it, then its own chunks, on the prefilling worker (packed
           into steps as the scheduler packs them: `StepCosts.prefill_steps`); remote
           adds the KV's delivery (profile: wire + scatter per block) and two waits for the ends
           of D's steps, its reservation before the prefill and its start once the KV landed
           (`_first_token_on`)
    stall  the time its prefill adds to every step of the prefilling worker's running streams,
           times their number: what the streams already running there lose
    decode its output (the forecast length: costmodel/output_length.py, capped by max_tokens)
           on the decoding worker: each step with one stream more, plus what that stream
           adds to the step of every stream already there
    blocked  local on a decode-tier worker: what the requests expected to arrive meanwhile (the
           router's placements a second, shared over the decode tier) lose to its prompt's
           steps. Every stream reaches a decode worker, and a hand-off waits for step ends
           there (its reservation, then its start: `HANDOFF_WAIT_STEPS`); a long prompt's
           chunks make those steps long. Priced without it, a long prompt went local on an idle
           decode worker (the transfer saved, 0.03 s) and the chat arriving behind it waited
           3 s for its first token (docs/disaggregation.md, the chat-heavy mix)
    cost   ttft + stall + decode + blocked (a second lost by the new request, by a running one
           or by one about to arrive counts the same)

Each worker's steps are priced by the profile as corrected by that worker's measured steps (its
Load reports them, costmodel/correction.py): a profile from another host, or a worker slower
than its peers, is priced at what its steps take here. A worker that has not stepped yet is
priced by its peers' measured steps.

The cheapest option wins; exact ties go to the first in the order above (a short prompt on an
idle decode worker stays there: no hand-off). Under an ITL SLO the options on a prefill worker
(lending it, or a stream more for one lent) are offered only when no decode worker can take the
stream within the SLO (`_lending_only_when_needed`), and a prompt longer than one step is
prefilled beside running streams only when no worker without streams can take it
(`_long_prompts_where_no_stream_waits`). The reason (`PlacementReason`, the members
after LONG_PROMPT) names what decided. A prefill worker is offered streams only when idle or
already lent, so a busy prefill tier keeps prefilling; a lent worker returns to prefill-only
once its streams are done (roles.py). So when the prefill side idles its cores decode (under an
ITL SLO: when decode needs them); streams spread over the workers that decode (the decode
term); and a long prompt goes where its prefill stalls the fewest streams (the stall term),
which once the prefill worker decodes too is often the prefill worker itself (remote, with the
reason `spares_streams`).

Torch-free, and called alike by the router (router/dispatch.py) and the planner's simulator
(planner/sim_cluster.py).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.core.kv.block_pool import blocks_for
from pdserve.costmodel.correction import StepWindow
from pdserve.costmodel.step_budget import StepCosts
from pdserve.costmodel.step_shape import StepShape
from pdserve.router.placement.prefill_place import Placement, PlacementReason, PrefillPlace

# A request handed off to a decode worker waits for a step to end twice there: its reservation
# (blocks for its KV) at the end of the step running when it arrives, half a step on average,
# and its start (KV landed, first token) at the end of the next (decode_service/engine.py polls
# both between steps).
HANDOFF_WAIT_STEPS = 1.5


class WorkerRole(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class WorkerState:
    """What the router knows of one worker when it places a request."""

    address: str
    tier: WorkerRole  # where it is deployed: prefill workers send KV, decode workers receive it
    role: WorkerRole  # what it does now: a prefill worker lent streams is in the decode role
    running: int = 0  # streams in its batch
    context_tokens: int = 0  # their context (prompt + output so far)
    pending_prompts: int = 0  # prompts accepted and not yet fully prefilled
    pending_prompt_tokens: int = 0  # their tokens still to compute
    step_windows: tuple[StepWindow, ...] = ()  # its recent steps, measured (none: uncorrected)
    step_cap_s: float = 0.0  # the cap its last step's prompt tokens were held to (0: none)

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.pending_prompts == 0 and self.pending_prompt_tokens == 0

    @property
    def decodes(self) -> StepShape:
        return StepShape.decodes(self.running, self.context_tokens)

    def queued_prompts(self) -> tuple[int, ...]:
        """The queued prompt tokens as that many prompts of equal length (Load reports sums)."""
        if self.pending_prompt_tokens == 0:
            return ()
        count = max(self.pending_prompts, 1)
        return (self.pending_prompt_tokens // count,) * count


@dataclass(frozen=True)
class Option:
    place: PrefillPlace
    decode: WorkerState  # where it decodes (and, local, prefills)
    prefill: WorkerState | None  # remote: where it prefills
    ttft_s: float
    stall_s: float  # summed over the streams running where it is prefilled
    decode_s: float = 0.0  # its decode steps, plus what it adds to the streams decoding beside it
    step_s: float = 0.0  # one step of the decoding worker with it in: its time per output token
    # The longest step the streams running where it is prefilled see while its own chunks run
    # (0: none run there): what admission keeps within their TPOT (router/slo_admission.py).
    running_step_s: float = 0.0
    blocked_s: float = 0.0  # what requests arriving during its prefill lose (module docstring)

    @property
    def cost_s(self) -> float:
        return self.ttft_s + self.stall_s + self.decode_s + self.blocked_s


@dataclass(frozen=True)
class AdaptiveChoice:
    placement: Placement
    option: Option

    @property
    def lends(self) -> bool:
        """Runs on a prefill worker not yet lent: its role turns to decode."""
        worker = self.option.decode
        return worker.tier is WorkerRole.PREFILL and worker.role is WorkerRole.PREFILL


@dataclass(frozen=True)
class _Prefill:
    done_s: float  # until its last chunk's step ends
    stall_s: float
    first_step_s: float  # the worker's next step (0: idle)
    longest_own_step_s: float = 0.0  # of this prompt's own steps, while streams run there
    # Its own steps' seconds times their mean excess over a decode-only step: what an arrival
    # rate times HANDOFF_WAIT_STEPS turns into seconds lost by requests arriving meanwhile.
    blocking_s2: float = 0.0


def place_adaptive(
    prompt_tokens: int,
    output_tokens: int,
    workers: Sequence[WorkerState],
    costs: StepCosts,
    arrivals_per_s: float = 0.0,
) -> AdaptiveChoice:
    """The cheapest option for a prompt of `prompt_tokens` tokens expected to generate
    `output_tokens`, with requests placed at `arrivals_per_s` (module docstring)."""
    workers = _priced_by_peers(workers)
    options = _local_options(prompt_tokens, workers, costs, arrivals_per_s)
    remote = _remote_options(prompt_tokens, workers, costs)
    options = [_with_decode(o, prompt_tokens, output_tokens, costs) for o in options]
    options = _lending_only_when_needed(options, prompt_tokens, costs)
    remote = [_with_decode(o, prompt_tokens, output_tokens, costs) for o in remote]
    if not options and not remote:
        raise ValueError("workers: none can take the request")
    candidates = _long_prompts_where_no_stream_waits([*options, *remote], prompt_tokens, costs)
    best = min(candidates, key=lambda option: option.cost_s)  # first of equals
    return AdaptiveChoice(Placement(best.place, _reason(best, options, remote)), best)


def _long_prompts_where_no_stream_waits(
    options: list[Option], prompt_tokens: int, costs: StepCosts
) -> list[Option]:
    """Under an ITL SLO, a prompt longer than one step's tokens (max_num_batched_tokens) is
    prefilled beside running streams only when no worker without streams can prefill it. The
    cost sums seconds alike, a long prompt's TTFT and the streams' stall; but a long prompt's
    TTFT SLO grows with its length while a stream's TPOT has a fixed slack, which the workers'
    `mean` step budget spends at once on the prompt's first chunks (costmodel/step_budget.py)
    and later steps, busier than the decode-only steps it assumed, do not give back. Priced
    alone, a long prompt went local beside chat streams whenever the prefill worker had a
    prompt queued, and those streams missed their TPOT where the conditional arm, which sends
    every long prompt to the prefill tier, kept them (docs/disaggregation.md, the default mix).
    A prompt of one step costs the streams one longer step: it is priced like any option."""
    if costs.itl_slo_s is None or prompt_tokens <= costs.max_num_batched_tokens:
        return options
    quiet = [option for option in options if (option.prefill or option.decode).running == 0]
    return quiet or options


def _lending_only_when_needed(
    options: list[Option], prompt_tokens: int, costs: StepCosts
) -> list[Option]:
    """Under an ITL SLO, a prefill worker (idle, or lent already) decodes a new stream only when
    no decode worker can take it within the SLO (`_takes_within`). Priced alone, an idle prefill
    worker is always the cheaper decoder (a batch of one steps fastest), so it was lent most chat
    streams; the next long prompt then shared its steps with streams wherever it went, and chat
    missed its TPOT where a prefill worker kept for prompts served every class
    (docs/disaggregation.md, the default mix). Without an SLO there is no bound to decide by:
    lending is priced like any option."""
    slo = costs.itl_slo_s
    own = [option for option in options if option.decode.tier is WorkerRole.DECODE]
    if slo is None or not any(_takes_within(option, slo, prompt_tokens, costs) for option in own):
        return options
    return own


def _takes_within(option: Option, slo: float, prompt_tokens: int, costs: StepCosts) -> bool:
    """Whether `option.decode` steps within `slo` with the stream in, and, for a prompt of one
    step, already does now: a decode worker prefilling with no stream of its own runs whole
    chunks (nothing caps them), and a stream handed to it waits for two of them to end. Judged on
    the first alone, the chat arriving just after a long prompt went local on an idle decode
    worker was handed off there, not lent the idle prefill worker, and waited 3.0-3.3 s for its
    first token against a 2 s SLO (docs/disaggregation.md, the chat-heavy mix). A longer prompt's
    stream starts only after its own chunks: judged by the step in progress too, a 2,121-token
    prompt arriving while decode prefilled another lent the idle prefill worker, the next long
    prompt was prefilled there beside its stream, and both missed their TPOT (the long-heavy
    mix)."""
    if option.step_s > slo:
        return False
    if prompt_tokens > costs.max_num_batched_tokens:
        return True
    return _prefill_on(option.decode, 0, costs).first_step_s <= slo


def _priced_by_peers(workers: Sequence[WorkerState]) -> list[WorkerState]:
    """A worker that has not stepped yet (no measured windows) is priced by what its peers'
    steps measured: the same model, and in one deployment the same host class. Priced by the
    bare profile, a profile of another host would set it apart from every measured worker: an
    idle prefill worker priced 1.5x slower than its measured decode peer was never lent."""
    pooled = tuple(window for worker in workers for window in worker.step_windows)
    if not pooled:
        return list(workers)
    return [w if w.step_windows else dataclasses.replace(w, step_windows=pooled) for w in workers]


def _local_options(
    prompt_tokens: int, workers: Sequence[WorkerState], costs: StepCosts, arrivals_per_s: float
) -> list[Option]:
    def order(worker: WorkerState) -> int:  # decode tier, then lent, then idle prefill workers
        return [worker.tier, worker.role].count(WorkerRole.PREFILL)

    takers = [w for w in workers if w.role is WorkerRole.DECODE or w.idle]
    decode_tier = sum(w.tier is WorkerRole.DECODE for w in workers)
    options = []
    for worker in sorted(takers, key=order):
        prefill = _prefill_on(worker, prompt_tokens, costs)
        handoffs_per_s = arrivals_per_s / decode_tier if worker.tier is WorkerRole.DECODE else 0.0
        options.append(
            Option(
                PrefillPlace.LOCAL,
                worker,
                None,
                prefill.done_s,
                prefill.stall_s,
                running_step_s=prefill.longest_own_step_s,
                blocked_s=handoffs_per_s * HANDOFF_WAIT_STEPS * prefill.blocking_s2,
            )
        )
    return options


def _remote_options(
    prompt_tokens: int, workers: Sequence[WorkerState], costs: StepCosts
) -> list[Option]:
    decode = [w for w in workers if w.tier is WorkerRole.DECODE]
    delivery = costs.profile.blocks.delivery_s(blocks_for(prompt_tokens, costs.profile.block_size))
    options = []
    for sender in (w for w in workers if w.tier is WorkerRole.PREFILL):
        prefill = _prefill_on(sender, prompt_tokens, costs)
        for receiver in decode:
            ttft = _first_token_on(receiver, prefill.done_s + delivery, costs)
            options.append(
                Option(
                    PrefillPlace.REMOTE,
                    receiver,
                    sender,
                    ttft,
                    prefill.stall_s,
                    running_step_s=prefill.longest_own_step_s,
                )
            )
    return options


def _first_token_on(receiver: WorkerState, ready_s: float, costs: StepCosts) -> float:
    """When a stream prefilled elsewhere starts on `receiver`, its prefill and delivery taking
    `ready_s`: its Reserve is answered at the end of the receiver's step in progress (half of it
    left, on average), the prefill starts then, and the stream starts at the end of the step the
    receiver runs when its KV lands (decode_service/engine.py takes both between steps). Priced
    as the prefill plus the one step in progress, the hand-offs to a decode worker with prompts
    queued took a median 1.14x their predicted TTFT (docs/disaggregation.md, "Predicted against
    measured TTFT"): its later chunks are as long as the first."""
    costs = costs.corrected(receiver.step_windows)
    decoding_s = costs.seconds(receiver.decodes) if receiver.running else 0.0
    queue = costs.prefill_steps(receiver.decodes, receiver.queued_prompts())
    steps = [costs.seconds(shape) for shape, _ in queue] or [decoding_s]
    reserved_s = steps[0] / 2
    landed_s = reserved_s + ready_s
    step_end_s = reserved_s
    for step in steps[1:]:
        if step_end_s >= landed_s:
            return step_end_s
        step_end_s += step
    if step_end_s >= landed_s or decoding_s == 0.0:  # past its queue an idle worker starts it
        return max(step_end_s, landed_s)
    return step_end_s + math.ceil((landed_s - step_end_s) / decoding_s) * decoding_s


def _with_decode(
    option: Option, prompt_tokens: int, output_tokens: int, costs: StepCosts
) -> Option:
    """Prices its decode on `option.decode`: `output_tokens` steps with one stream more, each
    also slowing the streams already there by what one more stream adds to a step."""
    worker = option.decode
    costs = costs.corrected(worker.step_windows)
    before = costs.seconds(worker.decodes) if worker.running else 0.0
    after = costs.seconds(worker.decodes + StepShape.decodes(1, prompt_tokens))
    per_token = after + worker.running * (after - before if worker.running else 0.0)
    return dataclasses.replace(option, decode_s=output_tokens * per_token, step_s=after)


def _prefill_on(worker: WorkerState, prompt_tokens: int, costs: StepCosts) -> _Prefill:
    """The steps `worker` takes for its queued prompts and then this one (0: none), beside its
    running streams."""
    costs = costs.corrected(worker.step_windows)
    alone = costs.seconds(worker.decodes) if worker.running else 0.0
    queued = worker.queued_prompts()
    ahead = sum(queued)
    steps: list[float] = []
    # This prompt's chunks, each priced beside the decodes alone: a step it shares with the
    # tail of the queue ahead is long for that queue's sake, not this prompt's.
    own: list[float] = []
    done = 0
    prompts = (*queued, prompt_tokens)
    for shape, tokens in costs.prefill_steps(worker.decodes, prompts, worker.step_cap_s or None):
        steps.append(costs.seconds(shape))
        own_start, done = max(done - ahead, 0), done + tokens
        if done > ahead:
            chunk = StepShape.prompt_chunk(own_start, done - ahead - own_start)
            own.append(costs.seconds(worker.decodes + chunk))
    stall = worker.running * sum(step - alone for step in steps)
    longest_own = max(own, default=0.0) if worker.running else 0.0
    excess = [step - alone for step in own]
    blocking = sum(own) * sum(excess) / len(excess) if excess else 0.0
    return _Prefill(sum(steps), stall, steps[0] if steps else alone, longest_own, blocking)


def _reason(best: Option, local: list[Option], remote: list[Option]) -> PlacementReason:
    if not remote:
        return PlacementReason.NO_PREFILL_WORKER
    if best.place is PrefillPlace.REMOTE:
        fastest_local = min((option.ttft_s for option in local), default=float("inf"))
        spares = fastest_local < best.ttft_s
        return PlacementReason.SPARES_STREAMS if spares else PlacementReason.REMOTE_FASTER
    if best.decode.tier is WorkerRole.DECODE:
        return PlacementReason.LOCAL_CHEAPER
    if best.decode.role is WorkerRole.PREFILL:
        return PlacementReason.PREFILL_IDLE
    return PlacementReason.LENT_PREFILL_WORKER
