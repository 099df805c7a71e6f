"""Where one request's time went, as the router saw it (the `Timings` of the last answer)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc

from pdserve.router import metrics
from pdserve.router.errors import RouterError
from pdserve.v1 import common_pb2, prefill_pb2


@dataclass(frozen=True)
class Deadline:
    """The client's deadline as a time.monotonic() instant; None when the client set none."""

    at: float | None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        return cls(None if seconds is None else time.monotonic() + seconds)

    def remaining(self) -> float | None:
        """Seconds left, for a downstream timeout; DEADLINE_EXCEEDED once none are."""
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise RouterError(grpc.StatusCode.DEADLINE_EXCEEDED, "router: deadline exceeded")
        return left


@dataclass
class RequestClock:
    """Filled in as the request moves on; all times are time.monotonic() seconds."""

    arrival: float = field(default_factory=time.monotonic)
    # When the Prefill call that succeeded was sent (earlier tries count as queueing).
    prefill_sent: float | None = None
    prefill: prefill_pb2.PrefillTimings | None = None
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0
    # The TTFT predicted for it: by adaptive placement, else by the admission of a request
    # judged under an SLO (router/slo_admission.py); None: no prediction.
    predicted_ttft: float | None = None
    place: str = ""  # where its prompt was prefilled: local, remote (its metric's label)

    def on_prefill_sent(self) -> None:
        self.prefill_sent = time.monotonic()

    def on_prefill_done(self, timings: prefill_pb2.PrefillTimings) -> None:
        self.prefill = timings

    def on_tokens(self, count: int) -> None:
        now = time.monotonic()
        self.num_tokens += count
        if self.first_token is None:
            self.first_token = now
            metrics.TIME_TO_FIRST_TOKEN.observe(now - self.arrival)
            if self.predicted_ttft and self.place:
                ratio = (now - self.arrival) / self.predicted_ttft
                metrics.TTFT_PREDICTION_RATIO.labels(self.place).observe(ratio)
        elif self.last_token is not None and count > 0:
            gap = (now - self.last_token) / count
            metrics.INTER_TOKEN_LATENCY.observe(gap)
        if count > 0:
            self.last_token = now

    def on_finished(self, prompt_tokens: int) -> None:
        metrics.END_TO_END_LATENCY.observe(time.monotonic() - self.arrival)
        metrics.PROMPT_TOKENS.observe(prompt_tokens)
        metrics.OUTPUT_TOKENS.observe(self.num_tokens)

    def to_proto(self) -> common_pb2.Timings:
        now = time.monotonic()
        prefill = self.prefill or prefill_pb2.PrefillTimings()
        # Waiting before any compute: in the router and in Reserve (until Prefill was sent),
        # then in the prefill worker's queue.
        router_wait = (self.prefill_sent or now) - self.arrival
        return common_pb2.Timings(
            queue_seconds=router_wait + prefill.queue_seconds,
            prefill_seconds=prefill.prefill_seconds,
            transfer_seconds=prefill.transfer_seconds,
            first_token_seconds=(self.first_token or now) - self.arrival,
            total_seconds=(self.last_token or now) - self.arrival,
        )
