"""`pdserve bench admission`: the router's admission modes against the same overload.

    pdserve bench admission [--model PATH] [--workload SPEC] [--rates R,...] [--duration S]
        [--repeats N] [--admission off,queue,predict] [--max-queue Q] [--tenants FILE]
        [--flood NAME] [--flood-factor F] [--policy P] [--json]

Every arm is the same deployment as `bench disagg`'s adaptive arm (1 prefill + 1 decode worker,
one core each, adaptive placement on this host's profile), the same requests at the same
Poisson arrivals (SPEC as `bench disagg` reads it, per-class TTFT SLOs included), warmed up
first; the arms take turns per repeat, their order rotated. They differ only in what the router
admits:

    off       every request (the router's default --max-queue, 256, is never reached)
    queue     at most --max-queue streams in flight, the rest RESOURCE_EXHAUSTED at once
    predict   each request carries its class's TTFT SLO (`slo.ttft_seconds`) and the router
              --slo-tpot: those predicted to miss are refused at once (docs/admission.md)

A row per arm and rate (the repeats pooled): `{"arm", "rate", "attainment_admitted",
"rejected_fraction", "goodput", "ttft_p99_admitted", "tpot_p99_admitted", "prediction_error_p50",
"requests", "repeats", "attainment_admitted_ci", "goodput_ci", "tenant", "scenario"}` (the
intervals: 95 % t over the repeats' own values; tenant and scenario null without --tenants).
`--tenants FILE` goes to every arm's router, and every tenant the file lists sends its weighted
share of each rate as a client of its own, with its tenant header: a row per arm, rate, scenario
and tenant; `--flood NAME` runs every point with that tenant silent (`alone`) and sending
`--flood-factor` (5) times its share (`flood`), the others the same requests both times
(bench/admission/tenants.py). `--policy` is the workers' scheduling policy (default fcfs; `fair`
shares each worker's steps between tenants by weight: core/sched/fair_share.py). goodput: requests
that met their SLOs per second of arrivals (refused ones never do); prediction_error_p50: the
predict arm's median |measured / predicted TTFT - 1| of admitted requests, read from the router's
histogram `pdserve_router_ttft_prediction_ratio` (so to its buckets' resolution).
"""

from __future__ import annotations

import argparse
import json
import math
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pdserve.bench.admission.tenants import Flood, scenarios, send_tenants, tenant_loads
from pdserve.bench.disagg.arms import ARMS, running_arm
from pdserve.bench.disagg.attainment import RequestOutcome, outcomes
from pdserve.bench.disagg.cli import WARMUP_PER_WORKER, BenchSettings, Point, plan_points
from pdserve.bench.disagg.send import plan_load, send_plan
from pdserve.bench.disagg.workload import (
    PlannedRequest,
    RequestClass,
    load_spec,
    plan_requests,
    point_seed,
)
from pdserve.core.config import SchedulingPolicy
from pdserve.costmodel.host_profile import host_profile
from pdserve.loadtest.calls import CallResult
from pdserve.loadtest.stats import Interval, mean_interval, percentile
from pdserve.local.cluster import Process
from pdserve.router.tenants import TenantConfig, TenantConfigError, load_tenants

MODES = ("off", "queue", "predict")
REFUSED = "ResourceExhausted"
RATIO = "pdserve_router_ttft_prediction_ratio"


@dataclass(frozen=True)
class Served:
    """One point as an arm served it: each request's outcome and whether it was refused."""

    outcomes: tuple[RequestOutcome, ...]
    refused: tuple[bool, ...]
    prediction_error: float  # nan: no request judged


@dataclass(frozen=True)
class AdmissionRow:
    arm: str
    rate: float
    attainment_admitted: float
    rejected_fraction: float
    goodput: float
    ttft_p99_admitted: float | None
    tpot_p99_admitted: float | None
    prediction_error_p50: float | None
    requests: int
    repeats: int
    # 95 % t intervals over the repeats' own values (one repeat: the value itself)
    attainment_admitted_ci: tuple[float, float] = (0.0, 1.0)
    goodput_ci: tuple[float, float] = (0.0, 0.0)
    tenant: str | None = None  # with --tenants
    scenario: str | None = None  # with --tenants: shared, or alone / flood with --flood


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF model folder (default: embedded)")
    parser.add_argument("--workload", type=Path, default=None, help="request mix SPEC (JSON)")
    parser.add_argument("--rates", default="0.1,0.2,0.4,0.6", help="requests/s, comma-separated")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each rate")
    parser.add_argument("--admission", default=",".join(MODES), help="arms, comma-separated")
    parser.add_argument("--max-queue", type=int, default=4, help="the queue arm's --max-queue")
    parser.add_argument("--slo-tpot", type=float, default=0.15, help="TPOT SLO, seconds")
    parser.add_argument(
        "--tenants",
        type=Path,
        default=None,
        help="every arm's router --tenants; each listed tenant sends its weighted share",
    )
    parser.add_argument("--flood", default=None, help="with --tenants: this tenant floods")
    parser.add_argument("--flood-factor", type=float, default=5.0, help="times its share")
    parser.add_argument(
        "--policy",
        choices=[policy.value for policy in SchedulingPolicy],
        default=SchedulingPolicy.FCFS.value,
        help="the workers' scheduling policy (fair: tenants share steps by weight)",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed of the run's requests")
    parser.add_argument("--json", action="store_true", help="one JSON object per arm and rate")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep worker logs here")


def run(args: argparse.Namespace) -> int:
    from pdserve.core.model.config import load_model_config
    from pdserve.core.model.forward import cpu_float32_forward
    from pdserve.core.model.source import resolve_model

    modes = args.admission.split(",")
    rates = tuple(float(rate) for rate in args.rates.split(","))
    if set(modes) - set(MODES) or min(rates) <= 0 or args.repeats < 1 or args.max_queue < 1:
        print(f"pdserve bench admission: arms of {MODES}, rates > 0, repeats and --max-queue >= 1")
        return 2
    try:
        tenants = _tenants(args)
    except (TenantConfigError, ValueError) as error:
        print(f"pdserve bench admission: {error}")
        return 2
    model_dir = resolve_model(args.model)
    profile = host_profile(model_dir, "float32", cpu_float32_forward())
    settings = BenchSettings(
        rates, args.duration, args.repeats, args.seed, args.slo_tpot, 0, 512, profile
    )
    classes = load_spec(args.workload)
    vocab_size = load_model_config(model_dir).vocab_size
    load = Load(classes, vocab_size, tenants)
    points = plan_points(classes, settings, vocab_size)
    warmup = plan_requests(classes, 2 * WARMUP_PER_WORKER, vocab_size, point_seed(args.seed, "w"))
    served: dict[RowKey, list[Served]] = {}
    for repeat in range(args.repeats):
        shift = repeat % len(modes)  # the arms' order rotates: a drifting host weighs on all
        for mode in modes[shift:] + modes[:shift]:
            todo = [point for point in points if point.repeat == repeat]
            for sent in _run_arm(mode, model_dir, todo, warmup, settings, load, args):
                found = outcomes(sent.plan, sent.results, settings.tpot_slo_s)
                by_number = sorted(sent.results, key=_number)
                refused = tuple(result.status == REFUSED for result in by_number)
                run = Served(tuple(found), refused, sent.error)
                key = RowKey(mode, sent.rate, sent.scenario, sent.tenant)
                served.setdefault(key, []).append(run)
    for key, runs in served.items():
        row = _row(key, runs, args.duration)
        print(json.dumps(asdict(row)) if args.json else _line(row), flush=True)
    return 0


@dataclass(frozen=True)
class RowKey:
    arm: str
    rate: float
    scenario: str | None = None
    tenant: str | None = None


@dataclass(frozen=True)
class Tenants:
    config: TenantConfig
    flood: Flood | None


@dataclass(frozen=True)
class Load:
    """What each point sends: the mix, and with --tenants who sends it."""

    classes: tuple[RequestClass, ...]
    vocab_size: int
    tenants: Tenants | None


@dataclass(frozen=True)
class Sent:
    """One point's requests of one sender (the whole point, or one tenant in one scenario)."""

    rate: float
    plan: tuple[PlannedRequest, ...]
    results: tuple[CallResult, ...]
    error: float  # the point's median TTFT prediction error (nan: none judged)
    scenario: str | None = None
    tenant: str | None = None


def _tenants(args: argparse.Namespace) -> Tenants | None:
    if args.tenants is None:
        if args.flood is not None:
            raise ValueError("--flood needs --tenants")
        return None
    config = load_tenants(args.tenants)
    if not config.tenants:
        raise ValueError(f"--tenants: {args.tenants} lists no tenant to send as")
    if args.flood is not None and args.flood not in config.tenants:
        raise ValueError(f"--flood: {args.flood!r} is not a tenant {args.tenants} lists")
    if not args.flood_factor > 0:
        raise ValueError("--flood-factor: must be > 0")
    flood = None if args.flood is None else Flood(args.flood, args.flood_factor)
    return Tenants(config, flood)


def _run_arm(
    mode: str,
    model_dir: Path,
    points: list[Point],
    warmup: tuple[PlannedRequest, ...],
    settings: BenchSettings,
    load: Load,
    args: argparse.Namespace,
) -> list[Sent]:
    router = _router_flags(mode, args)
    log_dir = None if args.log_dir is None else args.log_dir / mode
    workers = ("--policy", args.policy)
    with running_arm(
        ARMS["adaptive"], model_dir, settings.arms, log_dir, router, workers
    ) as cluster:
        send_plan(plan_load(cluster.router.address, warmup, rate=None, schedule_seed=0))
        sent: list[Sent] = []
        for point in points:
            if load.tenants is None:
                sent.append(_send_point(cluster.router, point, mode == "predict"))
            else:
                sent += _send_tenants(cluster.router, point, mode == "predict", load, args)
        return sent


def _send_point(router: Process, point: Point, with_slo: bool) -> Sent:
    before = _ratio_buckets(router)
    results = send_plan(
        plan_load(router.address, point.plan, point.rate, point.schedule_seed, with_slo)
    )
    error = _median_error(before, _ratio_buckets(router))
    return Sent(point.rate, point.plan, results, error)


def _send_tenants(
    router: Process, point: Point, with_slo: bool, load: Load, args: argparse.Namespace
) -> list[Sent]:
    assert load.tenants is not None
    config, flood = load.tenants.config, load.tenants.flood
    sent = []
    for scenario in scenarios(flood):
        loads = tenant_loads(
            point, config, load.classes, args.duration, load.vocab_size, args.seed, flood, scenario
        )
        before = _ratio_buckets(router)
        results = send_tenants(router.address, loads, config.header, with_slo)
        error = _median_error(before, _ratio_buckets(router))
        for tenant_load in loads:
            by_tenant = results[tenant_load.tenant]
            plan = tenant_load.plan
            sent.append(Sent(point.rate, plan, by_tenant, error, scenario, tenant_load.tenant))
    return sent


def _router_flags(mode: str, args: argparse.Namespace) -> tuple[str, ...]:
    tenants = () if args.tenants is None else ("--tenants", str(args.tenants))
    if mode == "queue":
        return ("--max-queue", str(args.max_queue), *tenants)
    if mode == "predict":
        return ("--slo-tpot", str(args.slo_tpot), *tenants)
    return tenants


def _ratio_buckets(router: Process) -> dict[float, float]:
    """The router's measured / predicted TTFT histogram: cumulative count per upper bound."""
    url = f"http://{router.host}:{router.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as page:
        text = page.read().decode()
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == RATIO + "_bucket":  # summed over its `place` label
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def _median_error(before: dict[float, float], after: dict[float, float]) -> float:
    """|median ratio - 1| of the point's admitted requests, the median taken as the upper bound
    of the bucket it falls in (nan when none was judged)."""
    counts = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    if total <= 0:
        return float("nan")
    median = next(bound for bound, count in counts.items() if count >= total / 2)
    return abs(median - 1.0)


def _row(key: RowKey, runs: list[Served], duration_s: float) -> AdmissionRow:
    found = [outcome for run in runs for outcome in run.outcomes]
    refused = [was_refused for run in runs for was_refused in run.refused]
    admitted = _admitted(found, refused)
    ttfts = sorted(o.ttft_s for o in admitted if o.ttft_s is not None)
    tpots = sorted(o.tpot_s for o in admitted if o.tpot_s is not None)
    errors = sorted(run.prediction_error for run in runs if not math.isnan(run.prediction_error))
    mode = key.arm
    each_attainment = [_attainment(_admitted(run.outcomes, run.refused)) for run in runs]
    each_goodput = [sum(o.meets_slo for o in run.outcomes) / duration_s for run in runs]
    return AdmissionRow(
        arm=mode,
        rate=key.rate,
        attainment_admitted=_attainment(admitted),
        rejected_fraction=sum(refused) / max(len(found), 1),
        goodput=sum(o.meets_slo for o in found) / (duration_s * len(runs)),
        ttft_p99_admitted=percentile(ttfts, 99) if ttfts else None,
        tpot_p99_admitted=percentile(tpots, 99) if tpots else None,
        prediction_error_p50=errors[len(errors) // 2] if errors and mode == "predict" else None,
        requests=len(found),
        repeats=len(runs),
        attainment_admitted_ci=_bounded(mean_interval(each_attainment), 1.0),
        goodput_ci=_bounded(mean_interval(each_goodput), math.inf),
        tenant=key.tenant,
        scenario=key.scenario,
    )


def _admitted(found: Sequence[RequestOutcome], refused: Sequence[bool]) -> list[RequestOutcome]:
    return [o for o, was_refused in zip(found, refused, strict=True) if not was_refused]


def _attainment(admitted: Sequence[RequestOutcome]) -> float:
    return sum(o.meets_slo for o in admitted) / max(len(admitted), 1)


def _bounded(interval: Interval, high: float) -> tuple[float, float]:
    return max(0.0, interval.low), min(high, interval.high)


def _number(result: CallResult) -> int:
    return -1 if result.request_number is None else result.request_number


def _line(row: AdmissionRow) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f} s"

    who = "" if row.tenant is None else f" {row.tenant} ({row.scenario})"
    return (
        f"{row.arm:>8} {row.rate:g} req/s{who}: attainment of admitted "
        f"{row.attainment_admitted:.2f} ({row.attainment_admitted_ci[0]:.2f}-"
        f"{row.attainment_admitted_ci[1]:.2f}), rejected {row.rejected_fraction:.2f}, goodput "
        f"{row.goodput:.3f} req/s, TTFT p99 "
        f"{seconds(row.ttft_p99_admitted)}, TPOT p99 {seconds(row.tpot_p99_admitted)} "
        f"({row.requests} requests, {row.repeats} repeats)"
    )
