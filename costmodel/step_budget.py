"""SLO-aware step budgets (Sarathi-Serve's idea, priced by the profiled cost model).

A worker that decodes and prefills in one step makes every stream in that step wait for the
prompt chunk. With `--itl-slo S`, each step's prompt tokens are capped so that the step's
predicted time (`Profile.step_seconds`) stays within S:

    chunk(start, n) fits  <=>  step_seconds(decodes + chunks granted so far + chunk) <= S

Sarathi-Serve derives one token budget from the TBT SLO offline; here the cap is priced per step
from what the step holds (its decodes' count and context, the chunk's position in its prompt:
attention makes later chunks of a long prompt dearer), so one setting holds for short and long
contexts alike. A step with no decodes has no stream to protect: only `max_num_batched_tokens`
bounds it. When the decodes alone fill the SLO, the first chunk still gets MIN_CHUNK_TOKENS:
otherwise a busy worker would never finish a prompt.

What S bounds (`--itl-slo-mode`, `ItlMode`):
- `step` (default): every step, as above. A prompt then needs as many steps as its chunks, each
  as dear as a decode step: on a 2-core host where a decode step of 2-8 streams costs 100-162 ms
  a 150 ms cap took 16-19 prompt tokens a step, and a 200-token chat prompt 12-13 steps (its TTFT
  well above colocated's: docs/disaggregation.md, "What earlier runs found").
- `mean`: each running stream's mean gap over its output on this worker, which is what a TPOT
  SLO judges. The step may spend a stream's slack: what it banked (its gaps so far came faster
  than S) and what its remaining tokens will leave if they come at the decode-only step time d
  (S - d each). Its remaining tokens are forecast from how long this worker's finished streams of
  its kind ran (costmodel/output_length.py), capped by what `max_tokens` leaves; a limit alone
  made a stream asking for 4,096 tokens lend the slack of gaps that never come. The cap is the
  least over the step's decodes of

      S * (gaps + 1) - elapsed + max(S - d, 0) * (remaining - 1)

  so every stream still averages S by its last token if the steps after this one decode only;
  later steps see what this one spent. Never below S: slack only loosens the `step` cap (a cap
  below S for streams behind starved prompts on a host too slow for S: docs/disaggregation.md).
  Without the remaining tokens' share (the mode's first form) a stream's first decode allowed
  only S, and on all-chat traffic, where some stream has always just started, every step
  beside decodes was capped at S, and adaptive lost to colocated on all-chat traffic
  (docs/disaggregation.md, "What earlier runs found").

The same arithmetic predicts how a prompt would be chunked on a worker (`prefill_steps`), which is
what the router's adaptive placement and the planner's simulator read.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from pdserve.costmodel.correction import Correction, StepRecorder, StepWindow, correction_from
from pdserve.costmodel.output_length import OutputLengths
from pdserve.costmodel.profile import Profile
from pdserve.costmodel.step_shape import StepShape


class _Limits(Protocol):
    @property
    def max_tokens(self) -> int: ...


class RunningStream(Protocol):
    """What the budget reads of a running request (core's `Request`; the simulator's too)."""

    @property
    def request_id(self) -> str: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def output_token_ids(self) -> list[int]: ...
    @property
    def params(self) -> _Limits: ...


# Prompt tokens a step may always take (one KV block at the default block size): progress for
# prompts on a worker whose decodes alone already use the SLO.
MIN_CHUNK_TOKENS = 16


class ItlMode(enum.Enum):
    """What the ITL SLO bounds (`--itl-slo-mode`)."""

    STEP = "step"  # every step's predicted time
    MEAN = "mean"  # each running stream's mean gap since its first decode here


@dataclass(frozen=True)
class StepCosts:
    """The cost model a worker steps by: its profile, token budget and ITL SLO (None: off), and
    what the worker's measured steps say of the profile (costmodel/correction.py)."""

    profile: Profile
    max_num_batched_tokens: int
    itl_slo_s: float | None = None
    itl_mode: ItlMode = ItlMode.STEP
    correction: Correction = dataclasses.field(default_factory=Correction)

    def __post_init__(self) -> None:
        if self.itl_slo_s is not None and not self.itl_slo_s > 0:
            raise ValueError(f"--itl-slo: must be > 0 seconds, got {self.itl_slo_s}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens: must be >= 1, got {self.max_num_batched_tokens}"
            )

    def seconds(self, shape: StepShape) -> float:
        return self.profile.step_seconds(shape) * self.correction.factor(shape)

    def corrected(self, measured: Iterable[StepWindow]) -> StepCosts:
        """These costs for a worker whose recent steps measured `measured`."""
        return dataclasses.replace(self, correction=correction_from(self.profile, measured))

    def for_step(self, decodes: StepShape, cap_s: float | None = None) -> SloPrefillLimit:
        """A step's limit, held to `cap_s` (None: to the SLO)."""
        return SloPrefillLimit(self, decodes, self.itl_slo_s if cap_s is None else cap_s)

    def prefill_steps(
        self, decodes: StepShape, prompts: tuple[int, ...], cap_s: float | None = None
    ) -> Iterator[tuple[StepShape, int]]:
        """The steps a worker running `decodes` takes to prefill `prompts` (token counts, in
        queue order), as (step shape, prompt tokens done in it). A step takes chunks of the next
        prompts while its token budget and limit leave room, as the scheduler's StepPlan does
        (priced a step per prompt, every short prompt queued ahead added a step's fixed cost).

        `cap_s` is the cap the worker held its last step to (its Load's step_cap_seconds). In
        `mean` mode that is over the SLO by its streams' slack, and each step spends what it
        takes over a decode-only step (WorkerStepBudget's cap falls by as much), never below the
        SLO. Without it every step is held within the SLO (`for_step`), and a worker in `mean`
        mode ran prompts queued behind others in fewer, larger chunks than predicted: 0.53-0.68x
        the predicted TTFT (docs/disaggregation.md, "Predicted against measured TTFT")."""
        slo = self.itl_slo_s
        spends = slo is not None and cap_s is not None and cap_s > slo  # else: the SLO each step
        cap = cap_s if spends else slo
        decode_only = self.seconds(decodes) if spends else 0.0
        pending = [length for length in prompts if length > 0]
        start = 0  # tokens of pending[0] already done
        while pending:
            limit = self.for_step(decodes, cap)
            budget, done = self.max_num_batched_tokens, 0
            while pending and budget > 0:
                wanted = min(pending[0] - start, budget)
                num_new = limit.grant(start, wanted)
                done, budget, start = done + num_new, budget - num_new, start + num_new
                if start < pending[0]:
                    break  # the limit or the budget ends the step inside this prompt
                pending.pop(0)
                start = 0
            yield limit.shape, done
            if spends and cap is not None and slo is not None:
                cap = max(cap + decode_only - self.seconds(limit.shape), slo)


class WorkerStepBudget:
    """A worker scheduler's step budget (core.step_plan.StepBudget): the step's cap from
    `costs.itl_mode`, on `clock` (the simulator passes its own). In `mean` mode it remembers
    when each running stream took its first decode here and how many tokens it had. With a
    `recorder` (the worker's own measured steps) every step is priced by the corrected costs;
    with `lengths`, a stream's remaining tokens are forecast (costmodel/output_length.py), else
    they are what its `max_tokens` leaves."""

    def __init__(
        self,
        costs: StepCosts,
        clock: Callable[[], float] = time.monotonic,
        recorder: StepRecorder | None = None,
        lengths: OutputLengths | None = None,
    ) -> None:
        self.costs = costs
        self._clock = clock
        self._recorder = recorder
        self._lengths = lengths
        self._first_decode: dict[str, tuple[float, int]] = {}  # request id -> (when, tokens)
        self._last_cap_s: float | None = None

    @property
    def last_cap_s(self) -> float | None:
        """The cap of the last step (what a worker's Load reports as step_cap_seconds)."""
        return self._last_cap_s

    def current_costs(self) -> StepCosts:
        """The costs as corrected by the steps measured so far."""
        if self._recorder is None:
            return self.costs
        return self.costs.corrected(self._recorder.windows)

    def for_step(self, decodes: Sequence[RunningStream]) -> SloPrefillLimit:
        costs = self.current_costs()
        shape = StepShape.decodes(len(decodes), sum(r.num_tokens for r in decodes))
        self._last_cap_s = self._cap(costs, decodes, shape)
        return SloPrefillLimit(costs, shape, self._last_cap_s)

    def _cap(
        self, costs: StepCosts, decodes: Sequence[RunningStream], shape: StepShape
    ) -> float | None:
        slo = costs.itl_slo_s
        if slo is None or costs.itl_mode is ItlMode.STEP:
            return slo
        now = self._clock()
        self._remember(decodes, now)
        spare_per_gap = max(slo - costs.seconds(shape), 0.0)  # a decode-only step's slack
        caps = []
        for request in decodes:
            since, tokens = self._first_decode[request.request_id]
            gaps = len(request.output_token_ids) - tokens
            later_gaps = max(self._remaining(request) - 1, 0)
            caps.append(slo * (gaps + 1) - (now - since) + spare_per_gap * later_gaps)
        # Never below S: on a host too slow for S every stream is behind, and a cap below S
        # left prompts 16 tokens a step (TTFT p99 6.2-6.7 s against colocated's 1.6 on chat).
        return max(min(caps, default=slo), slo)

    def _remaining(self, request: RunningStream) -> int:
        """Tokens the stream will still generate (this step's included)."""
        limit, generated = request.params.max_tokens, len(request.output_token_ids)
        if self._lengths is None:
            return max(limit - generated, 0)
        return self._lengths.remaining(limit, generated)

    def _remember(self, decodes: Sequence[RunningStream], now: float) -> None:
        """Keeps the step's decodes only: a stream out of the batch (finished, preempted)
        starts afresh if it comes back."""
        known = self._first_decode
        self._first_decode = {
            r.request_id: known.get(r.request_id) or (now, len(r.output_token_ids)) for r in decodes
        }


class SloPrefillLimit:
    """One step's prompt-token limit: grants chunks while the step's predicted time stays within
    `cap_s` (None: no cap; core.step_plan.PrefillLimit)."""

    def __init__(self, costs: StepCosts, decodes: StepShape, cap_s: float | None) -> None:
        self.costs = costs
        self.shape = decodes  # what the step holds so far
        self.cap_s = cap_s

    def grant(self, start: int, wanted: int) -> int:
        num_new = self._fitting(start, wanted)
        self.shape = self.shape + StepShape.prompt_chunk(start, num_new)
        return num_new

    def _fitting(self, start: int, wanted: int) -> int:
        slo = self.cap_s
        if slo is None or self.shape.decode_seqs == 0:
            return wanted
        floor = min(wanted, MIN_CHUNK_TOKENS) if self.shape.prefill_tokens == 0 else 0
        if not self._fits(start, wanted, slo):
            low, high = 0, wanted  # fits(low) or low == 0; not fits(high); the cost is monotone
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if self._fits(start, middle, slo) else (low, middle)
            wanted = low
        return max(wanted, floor)

    def _fits(self, start: int, num_new: int, slo: float) -> bool:
        return self.costs.seconds(self.shape + StepShape.prompt_chunk(start, num_new)) <= slo
