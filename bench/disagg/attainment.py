"""SLO attainment as DistServe reports it, per request, per point and per arm.

A request meets its SLOs when it completed, its TTFT is within its class's TTFT SLO, and its TPOT
is within the TPOT SLO. TPOT is the request's mean time per output token after the first:
(time of its last token - time of its first token) / (output tokens - 1), so a stream chunk that
carries several tokens counts for all of them (a request of one token has no TPOT and meets it).
A point's attainment is the share of its requests that met both; an arm's **goodput rate** is the
highest offered rate up to which every point's attainment is >= 90 % (DistServe's "goodput" of a
deployment: the rate it can take while meeting the SLOs; taking the lowest failing rate as the
end keeps a noisy lucky point above a failing one from counting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.bench.disagg.workload import PlannedRequest
from pdserve.loadtest.calls import CallResult

GOODPUT_ATTAINMENT = 0.9
NS_PER_S = 1e9


@dataclass(frozen=True)
class RequestOutcome:
    class_name: str
    completed: bool
    ttft_s: float | None
    tpot_s: float | None  # None: fewer than two tokens
    itl_gaps_s: tuple[float, ...]  # gaps between token-carrying stream chunks
    meets_slo: bool


def outcome(planned: PlannedRequest, result: CallResult, tpot_slo_s: float) -> RequestOutcome:
    """How one request of the plan fared against its SLOs."""
    ttft = None if result.first_token_ns is None else result.first_token_ns / NS_PER_S
    gaps = tuple(gap / NS_PER_S for gap in result.token_gaps_ns)
    tpot = sum(gaps) / (result.output_tokens - 1) if result.output_tokens > 1 else None
    meets = (
        result.ok
        and ttft is not None
        and ttft <= planned.ttft_slo_s
        and (tpot is None or tpot <= tpot_slo_s)
    )
    return RequestOutcome(planned.class_name, result.ok, ttft, tpot, gaps, meets)


def outcomes(
    plan: Sequence[PlannedRequest], results: Sequence[CallResult], tpot_slo_s: float
) -> list[RequestOutcome]:
    """Every planned request's outcome, in plan order; ValueError if a result is unaccounted."""
    by_number = {r.request_number: r for r in results if r.request_number is not None}
    if sorted(by_number) != list(range(len(plan))):
        raise ValueError(f"results cover requests {sorted(by_number)}, planned {len(plan)}")
    return [outcome(planned, by_number[i], tpot_slo_s) for i, planned in enumerate(plan)]


def record(planned: PlannedRequest, got: RequestOutcome) -> dict[str, object]:
    """One request as the benches' request logs write it (a JSON line): its class and lengths,
    what it got, whether it met its SLOs."""
    return {
        "class": planned.class_name,
        "prompt_tokens": len(planned.prompt),
        "max_tokens": planned.max_tokens,
        "ttft_slo_s": planned.ttft_slo_s,
        "ttft_s": got.ttft_s,
        "tpot_s": got.tpot_s,
        "completed": got.completed,
        "meets_slo": got.meets_slo,
    }


def attainment(requests: Sequence[RequestOutcome]) -> float:
    return sum(r.meets_slo for r in requests) / len(requests) if requests else 0.0


def goodput_rate(attainment_by_rate: Sequence[tuple[float, float]]) -> float:
    """The highest rate up to which every point (rate, mean attainment) reaches 90 %; 0.0 when
    even the lowest rate misses."""
    best = 0.0
    for rate, value in sorted(attainment_by_rate):
        if value < GOODPUT_ATTAINMENT:
            break
        best = rate
    return best
