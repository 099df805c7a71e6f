"""`pdserve bench disagg`: colocated, disaggregated, conditional and adaptive on the same two cores.

The methodology of vLLM's disaggregated-prefill benchmark, on this machine's budget of 2 cores:
every arm gets the same two worker processes' worth of CPU, one core each, one torch thread each
(`CpuPin`); the router and the load generator run beside them, unpinned.

    colocated      2 decode workers (core 0, core 1), no prefill tier: each prefills its own
                   requests inside its continuous batch (chunked prefill)
    disaggregated  1 prefill worker (core 0) + 1 decode worker (core 1); every prompt remote
    conditional    the same two workers; prompts shorter than --threshold are prefilled on decode
    adaptive       the same two workers; the router's cost model (--profile) places each prompt
                   and may lend the prefill worker streams, and every worker caps a decoding
                   step's prompt tokens to stay within --itl-slo (docs/router.md; 0: no cap)

The arms take turns, one repeat at a time: for each repeat every arm starts its cluster, is
warmed up (requests of every class, not counted), serves that repeat of every rate and stops; the
arms' order rotates from one repeat to the next (two arms run A B, B A, ...), so a host that
drifts in speed during the run (this class of machine does, by 1.5x within an hour) weighs on every
arm alike instead of on whichever ran last. A point (rate, repeat) sends `rate x --duration`
requests at Poisson arrivals, streamed through the router, drawn from a seed of its own that every
arm shares (workload.py): no prompt repeats within a run unless the SPEC asks for shared prefixes,
while the prefix cache stays on as users run it. The report is SLO attainment (attainment.py),
the goodput rate, and TTFT / ITL / TPOT percentiles.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pdserve.bench.disagg import counters
from pdserve.bench.disagg.arms import ARMS, Arm, ArmSettings, running_arm
from pdserve.bench.disagg.attainment import goodput_rate, outcomes, record
from pdserve.bench.disagg.report import ArmResult, Repeat, plot_results, print_header
from pdserve.bench.disagg.send import plan_load, send_plan
from pdserve.bench.disagg.workload import (
    PlannedRequest,
    RequestClass,
    load_spec,
    plan_requests,
    point_seed,
)
from pdserve.costmodel.host_profile import host_profile
from pdserve.local.cluster import Cluster

WARMUP_PER_WORKER = 3  # requests per worker before the first point: endpoints, pages, allocator


# The cost model measured on this project's 2-core CPU machine (docs/planning.md), in the source
# tree next to this package.
WORKLOADS = Path(__file__).resolve().parent.parent / "workloads"
# Shipped mixes beside the default (workload.py DEFAULT_SPEC): most requests chat, or most long.
MIXES = {name: WORKLOADS / f"disagg-mix-{name}.json" for name in ("chat-heavy", "long-heavy")}


@dataclass(frozen=True)
class BenchSettings:
    rates: tuple[float, ...]
    duration_s: float
    repeats: int
    seed: int
    tpot_slo_s: float
    threshold: int
    chunk_tokens: int
    profile: Path | None = None  # the adaptive arm's (None: no adaptive arm)
    itl_slo_s: float | None = None  # None: the TPOT SLO; 0: no step budget
    itl_slo_mode: str = "mean"  # a TPOT SLO judges each stream's mean gap
    max_repeats: int | None = None  # more repeats until the intervals are narrow (None: repeats)
    ci_width: float = 0.3  # the widest attainment interval that ranks arms

    @property
    def most_repeats(self) -> int:
        return self.repeats if self.max_repeats is None else max(self.max_repeats, self.repeats)

    @property
    def arms(self) -> ArmSettings:
        itl_slo = self.tpot_slo_s if self.itl_slo_s is None else self.itl_slo_s
        budget = itl_slo if itl_slo > 0 else None
        return ArmSettings(
            self.threshold, self.chunk_tokens, self.profile, budget, self.itl_slo_mode
        )


@dataclass(frozen=True)
class Point:
    """One repeat of one rate: its requests and its arrivals' seed, the same in every arm."""

    rate: float
    repeat: int
    plan: tuple[PlannedRequest, ...]
    schedule_seed: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF model folder (default: embedded)")
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--workload", type=Path, default=None, help="request mix SPEC (JSON)")
    workload.add_argument(
        "--mix",
        choices=sorted(MIXES),
        default=None,
        help="a shipped request mix instead of a SPEC (default: the default mix, 80 %% chat; "
        "bench/workloads/disagg-mix-NAME.json)",
    )
    parser.add_argument("--rates", default="0.05,0.1,0.2,0.3", help="requests/s, comma-separated")
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds of arrivals a point (rate x this)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each rate, fresh seeds (at least)"
    )
    parser.add_argument(
        "--max-repeats",
        type=int,
        default=8,
        help="more runs, one round of all rates at a time, until every arm's attainment "
        "interval at every rate is at most --ci-width wide, or this many (default 8)",
    )
    parser.add_argument(
        "--ci-width",
        type=float,
        default=0.3,
        help="widest 95 %% attainment interval that ranks arms (default 0.3)",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed of the run's requests")
    parser.add_argument("--arms", default=",".join(ARMS), help="which arms, comma-separated")
    parser.add_argument("--threshold", type=int, default=512, help="conditional arm's threshold")
    parser.add_argument("--chunk", type=int, default=512, help="max tokens a step (chunking)")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="adaptive arm's cost model (default: this host's, measured the first time and "
        "cached: costmodel/host_profile.py)",
    )
    parser.add_argument(
        "--itl-slo",
        type=float,
        default=None,
        help="adaptive arm's ITL SLO, s (default: TPOT's; 0: none)",
    )
    parser.add_argument(
        "--itl-slo-mode",
        choices=["step", "mean"],
        default="mean",
        help="what the adaptive arm's ITL SLO bounds (workers' --itl-slo-mode; default mean: "
        "the TPOT SLO judges each stream's mean gap)",
    )
    parser.add_argument(
        "--slo-tpot", type=float, default=0.15, help="TPOT SLO, seconds (TTFT SLOs: the SPEC)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per arm and rate")
    parser.add_argument("--plot", type=Path, default=None, help="write the PNG here")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep worker logs here")


def run(args: argparse.Namespace) -> int:
    from pdserve.core.model.config import load_model_config
    from pdserve.core.model.source import resolve_model

    try:
        settings = _settings(args)
        arms = [ARMS[name] for name in args.arms.split(",")]
        classes = load_spec(args.workload or MIXES.get(args.mix))
    except (ValueError, KeyError) as error:
        print(f"pdserve bench disagg: {error}", file=sys.stderr)
        return 2
    model_dir = resolve_model(args.model)
    vocab_size = load_model_config(model_dir).vocab_size
    points = plan_points(classes, settings, vocab_size)
    warmup = plan_requests(classes, 2 * WARMUP_PER_WORKER, vocab_size, point_seed(args.seed, "w"))
    if not args.json:
        print_header(_slo_text(classes, settings))
    served: dict[str, dict[float, list[Repeat]]] = {arm.name: {} for arm in arms}
    for repeat in range(settings.most_repeats):
        for arm in turn_order(arms, repeat):
            todo = [point for point in points if point.repeat == repeat]
            for rate, run in _run_arm(arm, model_dir, todo, warmup, settings, args, repeat):
                served[arm.name].setdefault(rate, []).append(run)
        if repeat + 1 >= settings.repeats and not _wide_intervals(served, settings):
            break
    results: list[ArmResult] = []
    for arm in arms:
        results.extend(_report_arm(arm.name, served[arm.name], settings, args.json))
    if args.plot is not None:
        plot_results(results, args.plot)
    return 0


def _settings(args: argparse.Namespace) -> BenchSettings:
    rates = tuple(float(r) for r in args.rates.split(","))
    if min(rates) <= 0:
        raise ValueError(f"--rates: every rate must be > 0, got {args.rates}")
    if args.itl_slo is not None and args.itl_slo < 0:
        raise ValueError(f"--itl-slo: must be >= 0 seconds (0: none), got {args.itl_slo}")
    if not 1 <= args.repeats <= args.max_repeats:
        raise ValueError(
            f"--repeats, --max-repeats: need 1 <= repeats <= max, got {args.repeats}, "
            f"{args.max_repeats}"
        )
    if not args.ci_width > 0:
        raise ValueError(f"--ci-width: must be > 0, got {args.ci_width}")
    return BenchSettings(
        rates,
        args.duration,
        args.repeats,
        args.seed,
        args.slo_tpot,
        args.threshold,
        args.chunk,
        _adaptive_profile(args),
        args.itl_slo,
        args.itl_slo_mode,
        args.max_repeats,
        args.ci_width,
    )


def _adaptive_profile(args: argparse.Namespace) -> Path | None:
    """The adaptive arm's profile: --profile, else this host's (None without an adaptive arm)."""
    from pdserve.core.model.source import resolve_model

    if "adaptive" not in args.arms.split(","):
        return None
    if args.profile is None:
        from pdserve.core.model.forward import cpu_float32_forward

        return host_profile(resolve_model(args.model), "float32", cpu_float32_forward())
    if not args.profile.is_file():
        raise ValueError(f"--profile: {args.profile} is not a file (the adaptive arm needs one)")
    return Path(args.profile)


def plan_points(
    classes: tuple[RequestClass, ...], settings: BenchSettings, vocab_size: int
) -> list[Point]:
    """Every point of the run, in the order each arm serves them."""
    points = []
    for rate in settings.rates:
        count = max(round(rate * settings.duration_s), 1)
        for repeat in range(settings.most_repeats):
            seed = point_seed(settings.seed, f"rate={rate}/repeat={repeat}")
            plan = plan_requests(classes, count, vocab_size, seed)
            points.append(Point(rate, repeat, plan, hash_seed(seed)))
    return points


def turn_order(arms: list[Arm], repeat: int) -> list[Arm]:
    """The arms in the order they serve `repeat`: rotated by one each repeat."""
    shift = repeat % len(arms)
    return arms[shift:] + arms[:shift]


def hash_seed(seed: str) -> int:
    """An int seed for the arrival schedule, stable across processes (unlike hash())."""
    return int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "little")


def _run_arm(
    arm: Arm,
    model_dir: Path,
    points: list[Point],
    warmup: tuple[PlannedRequest, ...],
    settings: BenchSettings,
    args: argparse.Namespace,
    repeat: int,
) -> list[tuple[float, Repeat]]:
    """One turn of `arm`: a fresh, warmed-up cluster serves `points` (one repeat's)."""
    log_dir = None if args.log_dir is None else args.log_dir / arm.name / f"repeat-{repeat}"
    # With logs kept, the router logs each placement (the adaptive arm's, with its prices).
    router_args = () if log_dir is None else ("--log-level", "debug")
    with running_arm(arm, model_dir, settings.arms, log_dir, router_args) as cluster:
        send_plan(plan_load(cluster.router.address, warmup, rate=None, schedule_seed=0))
        served = []
        for point in points:
            run = _run_point(cluster, point, settings, log_dir)
            _progress(arm.name, repeat, point.rate, run)
            served.append((point.rate, run))
        return served


def _progress(arm: str, repeat: int, rate: float, run: Repeat) -> None:
    """One line on stderr a point served: a run of an hour says where it is (stdout stays the
    report, --json parseable)."""
    met = sum(outcome.meets_slo for outcome in run.outcomes)
    stamp = time.strftime("%H:%M:%S")
    print(
        f"[{stamp}] {arm} repeat {repeat + 1} at {rate} req/s: {met} of {len(run.outcomes)} met",
        file=sys.stderr,
        flush=True,
    )


def _report_arm(
    name: str, served: dict[float, list[Repeat]], settings: BenchSettings, as_json: bool
) -> list[ArmResult]:
    results = [ArmResult.of(name, rate, runs) for rate, runs in served.items()]
    for result in results:
        print(json.dumps(asdict(result)) if as_json else f"  {result.line()}", flush=True)
    rate = goodput_rate([(r.rate, r.attainment) for r in results])
    wide = [r.rate for r in results if not _ranks(r, settings)]
    if as_json:
        print(json.dumps({"arm": name, "goodput_rate": rate, "wide_intervals": wide}), flush=True)
        return results
    print(f"  {name}: goodput rate {rate} req/s (attainment >= 90 % up to it)", flush=True)
    if wide:
        print(
            f"  {name}: attainment intervals wider than {settings.ci_width} at rates {wide} "
            "(more --max-repeats or a longer --duration narrow them): they do not rank the arms",
            flush=True,
        )
    return results


def _ranks(result: ArmResult, settings: BenchSettings) -> bool:
    """Whether the point's attainment interval is narrow enough to rank arms by (one repeat
    has no interval: it does not)."""
    low, high = result.attainment_ci
    return result.repeats >= 2 and high - low <= settings.ci_width


def _wide_intervals(served: dict[str, dict[float, list[Repeat]]], settings: BenchSettings) -> bool:
    return any(
        not _ranks(ArmResult.of(arm, rate, runs), settings)
        for arm, by_rate in served.items()
        for rate, runs in by_rate.items()
    )


def _run_point(
    cluster: Cluster, point: Point, settings: BenchSettings, log_dir: Path | None
) -> Repeat:
    """Serves one point; with `log_dir`, its requests carry ids (`rRATE-REPEAT-i`, in the
    router's log lines) and a line each goes to `requests-RATE.jsonl` there."""
    workers = cluster.prefill + cluster.decode
    ids = None if log_dir is None else f"r{point.rate:g}-{point.repeat}-"
    before = counters.snapshot(cluster.router, workers)
    load = plan_load(
        cluster.router.address, point.plan, point.rate, point.schedule_seed, id_prefix=ids
    )
    results = send_plan(load)
    counted = counters.snapshot(cluster.router, workers).since(before)
    served = outcomes(point.plan, results, settings.tpot_slo_s)
    if log_dir is not None:
        lines = [
            json.dumps({"request_id": f"{ids}{i}", **record(planned, got)}) + "\n"
            for i, (planned, got) in enumerate(zip(point.plan, served, strict=True))
        ]
        (log_dir / f"requests-{point.rate:g}.jsonl").write_text("".join(lines))
    return Repeat(tuple(served), counted)


def _slo_text(classes: tuple[RequestClass, ...], settings: BenchSettings) -> str:
    ttft = ", ".join(
        f"{c.name} {c.ttft_slo.seconds:g} s + {c.ttft_slo.per_prompt_token * 1e3:g} ms/prompt token"
        for c in classes
    )
    return f"SLOs: TTFT {ttft}; TPOT {settings.tpot_slo_s * 1e3:g} ms"
