"""The search: the cheapest deployment (fewest workers) whose simulated TTFT p90 and ITL p99 meet
the SLOs at the target rate (or, under a `PerRequestSlo`, whose share of requests within their
own TTFT and TPOT SLOs reaches its target: what the benchmarks score).

Worker counts grow one at a time; at each total every prefill/decode split is tried (0 prefill is
the colocated mode), each with a few engine settings (max_num_seqs, chunk budget) and, when it
has prefill workers, a few disaggregation thresholds (0 and the workload's prompt-length
quartiles; the prefill queue bound stays the router's default, which the plan's values carry) and,
when the search space includes it (`pdserve plan --placements threshold,adaptive`), the adaptive
placement, simulated with the router's own decision function.
The first total with a candidate that meets both SLOs wins, and among its candidates the one with
the lowest TTFT p90. Every candidate tried is kept for the table.

With admission on (`pdserve plan --admission predict`) every candidate's router refuses requests
predicted to miss the SLOs (the router's own `router/slo_admission.py`, in the simulation): a
candidate then meets the SLOs when its admitted requests do and it refused at most
`max_refused` of them, so the plan sizes for goodput with rejection on instead of for serving
every request.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from pdserve.core.config import EngineConfig
from pdserve.costmodel.profile import Profile
from pdserve.planner.sim_cluster import ClusterSim, Deployment, SimResult
from pdserve.planner.sim_report import summarize
from pdserve.planner.sim_worker import Role
from pdserve.planner.workload import TraceRequest
from pdserve.router.placement.prefill_place import PlacementConfig, PlacementMode
from pdserve.router.slo_admission import Slo as RequestSlo


@dataclass(frozen=True)
class PerRequestSlo:
    """SLOs judged request by request, as the benchmarks score them (`bench autoscale`, `bench
    disagg`): a request meets them when its TTFT is within `ttft_s` + `ttft_per_prompt_token_s`
    per prompt token and its mean time per output token after the first within `tpot_s`; a
    deployment meets them when at least `attainment` of the requests do."""

    ttft_s: float
    ttft_per_prompt_token_s: float
    tpot_s: float
    attainment: float

    def met_by(self, prompt_tokens: int, ttft_s: float, tpot_s: float | None) -> bool:
        ttft_slo = self.ttft_s + self.ttft_per_prompt_token_s * prompt_tokens
        return ttft_s <= ttft_slo and (tpot_s is None or tpot_s <= self.tpot_s)


@dataclass(frozen=True)
class Slo:
    ttft_p90_s: float
    itl_p99_s: float
    # Judged per request instead of by the percentiles above (which are then only reported).
    per_request: PerRequestSlo | None = None

    def met_by(self, summary: dict[str, float], attainment: float) -> bool:
        if self.per_request is not None:
            return attainment >= self.per_request.attainment
        return summary["ttft_p90"] <= self.ttft_p90_s and summary["itl_p99"] <= self.itl_p99_s


@dataclass(frozen=True)
class SearchSpace:
    max_workers: int = 16
    max_num_seqs: tuple[int, ...] = (16, 64)
    chunk_budgets: tuple[int, ...] = (256, 2048)
    placements: tuple[PlacementMode, ...] = (PlacementMode.THRESHOLD,)
    admission: bool = False  # routers refuse predicted misses (--slo-ttft / --slo-tpot)
    max_refused: float = 0.02  # with admission: the largest refused fraction that still meets


@dataclass(frozen=True)
class Candidate:
    deployment: Deployment
    ttft_p90: float
    itl_p99: float
    throughput: float
    completed_fraction: float  # of the requests admitted
    refused_fraction: float
    prefill_load: float  # mean prompts in a prefill worker (waiting + running)
    decode_running: float  # mean requests running in a decode worker
    meets: bool
    attainment: float = 1.0  # of the requests, under a per-request SLO (1.0 without one)

    @property
    def workers(self) -> int:
        return self.deployment.num_prefill + self.deployment.num_decode


@dataclass(frozen=True)
class PlanResult:
    tried: tuple[Candidate, ...]
    best: Candidate | None


def search(
    profile: Profile,
    requests: list[TraceRequest],
    slo: Slo,
    base: EngineConfig,
    space: SearchSpace = SearchSpace(),
    progress: Callable[[Candidate], None] = lambda candidate: None,
) -> PlanResult:
    tried: list[Candidate] = []
    for total in range(1, space.max_workers + 1):
        at_total = []
        for deployment in deployments(total, base, space, requests):
            if space.admission:
                deployment = replace(
                    deployment, admission=RequestSlo(slo.ttft_p90_s, slo.itl_p99_s)
                )
            candidate = evaluate(deployment, profile, requests, slo, space.max_refused)
            progress(candidate)
            at_total.append(candidate)
        tried.extend(at_total)
        meeting = [c for c in at_total if c.meets]
        if meeting:
            return PlanResult(tuple(tried), min(meeting, key=lambda c: c.ttft_p90))
    return PlanResult(tuple(tried), None)


def deployments(
    total: int, base: EngineConfig, space: SearchSpace, requests: list[TraceRequest]
) -> Iterator[Deployment]:
    prompts = sorted(r.prompt_tokens for r in requests)
    quartiles = (
        sorted({round(q) for q in statistics.quantiles(prompts, n=4)}) if len(prompts) > 1 else []
    )
    for seqs in space.max_num_seqs:
        for budget in space.chunk_budgets:
            engine = replace(base, max_num_seqs=seqs, max_num_batched_tokens=budget)
            for num_prefill in range(total):
                for placement in _placements(num_prefill, quartiles, space.placements):
                    yield Deployment(num_prefill, total - num_prefill, engine, engine, placement)


def _placements(
    num_prefill: int, quartiles: list[int], modes: tuple[PlacementMode, ...]
) -> Iterator[PlacementConfig]:
    """The router settings tried for a split (a colocated one has nothing to choose)."""
    if PlacementMode.THRESHOLD in modes or not num_prefill:
        for threshold in [0, *quartiles] if num_prefill else [0]:
            yield PlacementConfig(disagg_threshold=threshold)
    if PlacementMode.ADAPTIVE in modes and num_prefill:
        yield PlacementConfig(mode=PlacementMode.ADAPTIVE)


def evaluate(
    deployment: Deployment,
    profile: Profile,
    requests: list[TraceRequest],
    slo: Slo,
    max_refused: float = 0.0,
    streams: Sequence[TraceRequest] = (),
) -> Candidate:
    """`requests` through `deployment`, scored against `slo`; `streams`: already decoding at 0,
    unscored (ClusterSim.run)."""
    result = ClusterSim(deployment, profile).run(requests, streams)
    summary = summarize(result)
    admitted = summary["requests"] - summary["refused"]
    completed = summary["completed"] / max(admitted, 1)
    refused = summary["refused"] / max(summary["requests"], 1)
    attainment = 1.0 if slo.per_request is None else _attainment(result, slo.per_request)
    return Candidate(
        deployment=deployment,
        ttft_p90=summary["ttft_p90"],
        itl_p99=summary["itl_p99"],
        throughput=summary["throughput_tokens_per_s"],
        completed_fraction=completed,
        refused_fraction=refused,
        prefill_load=_mean_load(result, Role.PREFILL),
        decode_running=_mean_running(result),
        meets=completed == 1.0 and refused <= max_refused and slo.met_by(summary, attainment),
        attainment=attainment,
    )


def _attainment(result: SimResult, slo: PerRequestSlo) -> float:
    """The share of all requests (refused ones too) that completed within their SLOs."""
    met = 0
    for journey in result.journeys:
        times = journey.token_times
        if journey.refused or not times or len(times) != journey.output_tokens:
            continue
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        met += slo.met_by(journey.prompt_tokens, times[0] - journey.arrival_s, tpot)
    return met / len(result.journeys) if result.journeys else 1.0


def _mean_load(result: SimResult, role: Role) -> float:
    samples = [u.waiting + u.running for u in result.usage if u.worker.startswith(role.value)]
    return statistics.fmean(samples) if samples else 0.0


def _mean_running(result: SimResult) -> float:
    samples = [u.running for u in result.usage if u.worker.startswith(Role.DECODE.value)]
    return statistics.fmean(samples) if samples else 0.0


TABLE_HEADER = (
    f"{'config':12} {'seqs':>4} {'budget':>6} {'TTFT p90':>9} {'ITL p99':>8} "
    f"{'tok/s':>7} {'done':>5} {'refused':>7}  meets"
)


def format_row(candidate: Candidate) -> str:
    engine = candidate.deployment.decode_config
    return (
        f"{candidate.deployment.name:12} {engine.max_num_seqs:4} "
        f"{engine.max_num_batched_tokens:6} {candidate.ttft_p90:8.3f}s "
        f"{candidate.itl_p99 * 1e3:6.0f}ms {candidate.throughput:7.1f} "
        f"{candidate.completed_fraction:5.0%} {candidate.refused_fraction:7.1%}  "
        f"{'yes' if candidate.meets else 'no'}"
    )
