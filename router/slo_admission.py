"""Admission by predicted SLO miss: a request that would miss its TTFT or TPOT SLO is refused at
once, with a retry delay, instead of queueing until it misses and making every request behind it
miss too.

The prediction is adaptive placement's (placement/adaptive.py, the same function): the option it
would choose on the workers' live loads, priced by the profile as corrected by each worker's
measured steps (costmodel/correction.py), for the request's forecast output length
(costmodel/output_length.py). TTFT is that option's (the queue ahead, its own chunks, the KV's
delivery) plus the router's dispatch cost (`serving.dispatch_s`); TPOT is one step of its
decoding worker with it in. Admission also protects the streams already running where the request
would be prefilled: the longest step of its own prefill there (its chunks beside their decodes)
is their time per token while it runs, and a request that would push that past the TPOT SLO
(its own, else the router's: the one the running streams are held to unless they set theirs) is
refused too. Under `--placement threshold` the router may place the request
elsewhere than that option: the prediction is then the best the workers could do.

The retry delay says when the request might fit: its predicted TTFT's excess over the SLO (the
work ahead of it that must drain first), at least MIN_RETRY_S; a TPOT miss (too many streams
decoding) waits MIN_RETRY_S.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.costmodel.step_budget import StepCosts
from pdserve.router import metrics
from pdserve.router.errors import RouterError
from pdserve.router.placement.adaptive import Option, WorkerState, place_adaptive
from pdserve.v1 import generation_pb2

MIN_RETRY_S = 1.0


@dataclass(frozen=True)
class Slo:
    """A request's objectives, seconds (None: none)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    @property
    def any(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def or_else(self, defaults: Slo) -> Slo:
        """These objectives, `defaults`' where these set none."""
        ttft = self.ttft_s if self.ttft_s is not None else defaults.ttft_s
        return Slo(ttft, self.tpot_s if self.tpot_s is not None else defaults.tpot_s)

    @classmethod
    def from_proto(cls, message: generation_pb2.RequestSlo) -> Slo:
        """A request's own (0: none); INVALID_ARGUMENT naming the field for a bad value."""
        values = []
        for name in ("ttft_seconds", "tpot_seconds"):
            value = getattr(message, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidRequestError(f"slo.{name}", f"must be >= 0 seconds, got {value}")
            values.append(value if value > 0 else None)
        return cls(*values)


NO_SLO = Slo()


class Miss(enum.Enum):
    """Why a request is refused (the `reason` label of the rejections counter)."""

    TTFT = "ttft"
    TPOT = "tpot"
    RUNNING_TPOT = "running_tpot"  # its prefill would slow the streams running there past it


@dataclass(frozen=True)
class Prediction:
    ttft_s: float
    tpot_s: float
    running_step_s: float = 0.0  # the streams running where it is prefilled, per token, meanwhile


@dataclass(frozen=True)
class Refusal:
    miss: Miss
    prediction: Prediction
    slo_s: float
    retry_after_s: float

    def message(self) -> str:
        if self.miss is Miss.RUNNING_TPOT:
            return (
                f"router: its prefill would slow the streams running on its worker to "
                f"{self.prediction.running_step_s:.3f} s per token, past the TPOT SLO "
                f"{self.slo_s:.3f} s; retry in {self.retry_after_s:.0f} s"
            )
        predicted = self.prediction.ttft_s if self.miss is Miss.TTFT else self.prediction.tpot_s
        return (
            f"router: predicted {self.miss.value.upper()} {predicted:.3f} s misses the SLO "
            f"{self.slo_s:.3f} s on the workers' current load; retry in {self.retry_after_s:.0f} s"
        )


def predict(
    prompt_tokens: int,
    output_tokens: int,
    workers: Sequence[WorkerState],
    costs: StepCosts,
    arrivals_per_s: float = 0.0,
) -> Prediction:
    option = place_adaptive(prompt_tokens, output_tokens, workers, costs, arrivals_per_s).option
    return Prediction(ttft_as_seen(option, costs), option.step_s, option.running_step_s)


def ttft_as_seen(option: Option, costs: StepCosts) -> float:
    """The TTFT a client sees of `option`: its own, plus the router's dispatch cost."""
    return option.ttft_s + costs.profile.serving.dispatch_s


def judge(prediction: Prediction, slo: Slo) -> Refusal | None:
    """The refusal the prediction calls for under `slo`, or None: admitted."""
    if slo.ttft_s is not None and prediction.ttft_s > slo.ttft_s:
        excess = prediction.ttft_s - slo.ttft_s
        return Refusal(Miss.TTFT, prediction, slo.ttft_s, max(math.ceil(excess), MIN_RETRY_S))
    if slo.tpot_s is not None and prediction.tpot_s > slo.tpot_s:
        return Refusal(Miss.TPOT, prediction, slo.tpot_s, MIN_RETRY_S)
    if slo.tpot_s is not None and prediction.running_step_s > slo.tpot_s:
        return Refusal(Miss.RUNNING_TPOT, prediction, slo.tpot_s, MIN_RETRY_S)
    return None


class SloGate:
    """The router's admission by predicted miss, at a request's first placement (router/
    dispatch.py): atomic with the placement that follows (no await between), so a burst's
    requests each see the load of those admitted before them."""

    def __init__(
        self,
        defaults: Slo,
        costs: StepCosts | None,
        workers: Callable[[], Sequence[WorkerState]],
        forecast: Callable[[int, int], int],
        arrivals_per_s: Callable[[], float],
    ) -> None:
        self._defaults = defaults
        self._costs = costs
        self._workers = workers  # the workers as placement sees them now
        self._forecast = forecast  # (max_tokens, generated) -> tokens still to come
        self._arrivals_per_s = arrivals_per_s  # requests placed a second, now

    def check(self, prompt_tokens: int, max_tokens: int, own: Slo) -> Prediction | None:
        """Raises RouterError (RESOURCE_EXHAUSTED, a retry delay) for a predicted miss; the
        prediction of an admitted request (None: no SLO in force)."""
        slo = own.or_else(self._defaults)
        if not slo.any:
            return None
        if self._costs is None:
            raise InvalidRequestError(
                "slo", "this router predicts no SLOs: it was started without --profile"
            )
        output_tokens = self._forecast(max_tokens, 0)
        prediction = predict(
            prompt_tokens, output_tokens, self._workers(), self._costs, self._arrivals_per_s()
        )
        refusal = judge(prediction, slo)
        if refusal is not None:
            metrics.ADMISSION_REFUSALS.labels(refusal.miss.value).inc()
            raise RouterError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, refusal.message(), refusal.retry_after_s
            )
        return prediction
