"""`pdserve bench autoscale`: `pdserve autoscale` against every fixed deployment on the same
shifting load, pods at a CPU limit.

    pdserve bench autoscale [--model PATH] [--trace FILE] [--pod-cpus 0.5] [--arms A,...]
        [--slo-tpot S] [--slo-attainment A] [--interval-seconds S]
        [--window-seconds S] [--lookback-seconds S] [--json]

Each arm is a fresh `pdserve up --netns` whose worker pods each get `--pod-cpus` cores: a fixed
arm `1P2D` keeps 1 prefill and 2 decode pods throughout (`0PnD`: n colocated pods), the
`autoscale` arm starts at 1P1D with `pdserve autoscale --port` beside it (this host's profile,
corrected as it runs; at most --max-pods pods), and keeps a prefill tier; `autoscale-colocated`
starts at 0P1D and adds and removes colocated pods. Every arm is warmed up, then serves the same
requests: the trace's phases one after another, each its requests at Poisson times within it
over its mix (bench/autoscale/trace.py; the shipped trace by default). Arms run one after
another, in the order given.

One row per arm and phase: `{"arm", "phase", "attainment", "goodput", "pod_seconds":
{"prefill", "decode"}, "scale_events", "streams_migrated", "requests_lost", "requests",
"first_scale_down_s"}`.
A request belongs to the phase it arrived in, and meets its SLOs when its TTFT is within its
class's and its mean time per output token within --slo-tpot; goodput: those per second of the
phase; pod_seconds: the pods ready per tier, sampled every second, over the phase's window;
scale_events: the autoscaler's scale-ups and -downs in it; streams_migrated: streams the router
moved live with their KV (a scale-in's drain) in it; requests_lost: requests that did not
complete; first_scale_down_s: seconds from the phase's start to the autoscaler's first scale-in
line in it, which it prints once the pods have drained (null: none). After an arm's rows, a
summary: its pod-seconds in all and the phases it attained 0.9 in.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pdserve.bench.autoscale.deployment import (
    Autoscaler,
    Sample,
    Sampler,
    ScaleRow,
    Up,
    require_root,
)
from pdserve.bench.autoscale.trace import Phase, load_trace, tightest_ttft_slo
from pdserve.bench.disagg.attainment import outcomes, record
from pdserve.bench.disagg.send import plan_load, send_plan
from pdserve.bench.disagg.workload import PlannedRequest, plan_requests, point_seed
from pdserve.loadtest.calls import CallResult
from pdserve.loadtest.driver import drive
from pdserve.loadtest.schedule import LoadSchedule
from pdserve.planner.autoscale import Shape
from pdserve.planner.autoscale_view import LOOKBACK_SECONDS

AUTOSCALE = "autoscale"
AUTOSCALE_COLOCATED = "autoscale-colocated"
# Where each autoscaling arm starts: with a prefill tier, which it keeps (`pdserve scale` moves
# pods between tiers, never to no prefill tier), or colocated, where every pod prefills and
# decodes and the autoscaler adds and removes such pods (0P1D is as few as a cluster runs).
AUTOSCALED_FROM = {AUTOSCALE: Shape(1, 1), AUTOSCALE_COLOCATED: Shape(0, 1)}
MAX_PODS = 4
WARMUP_REQUESTS = 4
ATTAINED = 0.9


def fixed_shapes(max_pods: int = MAX_PODS) -> list[Shape]:
    """Every deployment of up to `max_pods` pods: colocated (0PnD) and split."""
    return [
        Shape(prefill, total - prefill)
        for total in range(1, max_pods + 1)
        for prefill in range(total)
    ]


def parse_shape(name: str) -> Shape:
    prefill, _, rest = name.partition("P")
    decode = rest.removesuffix("D")
    try:
        shape = Shape(int(prefill), int(decode))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{name!r}: an arm is autoscale or NPMD") from error
    if shape.prefill < 0 or shape.decode < 1 or not rest.endswith("D"):
        raise argparse.ArgumentTypeError(f"{name!r}: N >= 0 prefill, M >= 1 decode pods")
    return shape


def parse_arms(text: str) -> list[str]:
    arms = [part.strip() for part in text.split(",") if part.strip()]
    for arm in arms:
        if arm not in AUTOSCALED_FROM:
            parse_shape(arm)
    return arms


@dataclass(frozen=True)
class PhaseRow:
    arm: str
    phase: str
    attainment: float
    goodput: float
    pod_seconds: dict[str, float]
    scale_events: int
    streams_migrated: int
    requests_lost: int
    requests: int
    first_scale_down_s: float | None


@dataclass(frozen=True)
class Window:
    """A phase's span on the arm's clock (time.monotonic())."""

    phase: Phase
    start: float

    @property
    def end(self) -> float:
        return self.start + self.phase.seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    default_arms = ",".join([*AUTOSCALED_FROM, *(str(shape) for shape in fixed_shapes())])
    parser.add_argument("--model", type=Path, default=None, help="default: the embedded model")
    parser.add_argument("--trace", type=Path, default=None, help="default: the shipped one")
    parser.add_argument("--pod-cpus", type=float, default=0.5, help="each worker pod's cores")
    parser.add_argument("--arms", type=parse_arms, default=parse_arms(default_arms))
    parser.add_argument("--slo-tpot", type=float, default=0.3, help="seconds per output token")
    parser.add_argument(
        "--slo-attainment",
        type=float,
        default=0.95,
        help="the autoscaler's target share of requests within their SLOs (the trace's TTFT "
        "SLO, --slo-tpot); a phase is attained at 0.9",
    )
    parser.add_argument("--interval-seconds", type=float, default=15.0, help="the autoscaler's")
    parser.add_argument("--window-seconds", type=float, default=30.0, help="the autoscaler's")
    parser.add_argument(
        "--lookback-seconds", type=float, default=LOOKBACK_SECONDS, help="the autoscaler's"
    )
    parser.add_argument("--max-pods", type=int, default=MAX_PODS, help="the autoscaler's")
    parser.add_argument("--seed", type=int, default=0, help="of the requests (every arm's)")
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="each arm's logs, autoscaler lines, requests"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


def run(args: argparse.Namespace) -> int:
    from pdserve.core.model.config import load_model_config
    from pdserve.core.model.forward import cpu_float32_forward
    from pdserve.core.model.source import resolve_model
    from pdserve.costmodel.host_profile import host_profile

    # Started in the background of a non-interactive shell, it inherits SIGINT ignored: Ctrl-C
    # (`kill -INT`) must still stop it, and `_run_arm` then stops the arm's pods.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    reason = require_root()
    if reason is not None or not args.pod_cpus > 0:
        print(f"pdserve bench autoscale: {reason or '--pod-cpus must be > 0'}", file=sys.stderr)
        return 2
    model_dir = resolve_model(args.model)
    phases = load_trace(args.trace)
    vocab_size = load_model_config(model_dir).vocab_size
    plans = [phase.plan(vocab_size, args.seed) for phase in phases]
    warmup = plan_requests(
        phases[0].classes, WARMUP_REQUESTS, vocab_size, point_seed(args.seed, "autoscale/warmup")
    )
    profile = host_profile(model_dir, "float32", cpu_float32_forward())
    for arm in args.arms:
        rows = _run_arm(arm, args, model_dir, phases, plans, warmup, profile)
        for row in rows:
            print(json.dumps(asdict(row)) if args.json else _line(row), flush=True)
        print(json.dumps(_summary(arm, rows)), flush=True)
    return 0


def _run_arm(
    arm: str,
    args: argparse.Namespace,
    model_dir: Path,
    phases: Sequence[Phase],
    plans: Sequence[tuple[PlannedRequest, ...]],
    warmup: tuple[PlannedRequest, ...],
    profile: Path,
) -> list[PhaseRow]:
    shape = AUTOSCALED_FROM[arm] if arm in AUTOSCALED_FROM else parse_shape(arm)
    log_dir = None if args.log_dir is None else args.log_dir / arm
    up = Up(model_dir, shape, args.pod_cpus, log_dir)
    autoscaler: Autoscaler | None = None
    try:
        router = up.wait_ready()
        send_plan(plan_load(router, warmup, rate=None, schedule_seed=0))
        if arm in AUTOSCALED_FROM:
            autoscaler = Autoscaler(router, _autoscale_flags(args, profile, phases))
        sampler = Sampler(router)
        windows, results = _serve_phases(router, phases, plans)
        # The deployment runs to the last phase's end, however early its requests are done (a
        # quiet phase's few): that is where the autoscaler has to scale down.
        time.sleep(max(0.0, windows[-1].end - time.monotonic()))
        time.sleep(2 * args.interval_seconds if autoscaler else 0)  # its last decisions land
        samples = sampler.stop()
    finally:
        scaled = [] if autoscaler is None else _stop_autoscaler(autoscaler)
        up.stop()
    if log_dir is not None and scaled:  # what it decided, each line stamped on the arm's clock
        lines = (json.dumps({"at": r.at - windows[0].start, **r.row}) for r in scaled)
        (log_dir / "autoscale.jsonl").write_text("".join(line + "\n" for line in lines))
    if log_dir is not None:
        _write_requests(log_dir / "requests.jsonl", phases, plans, results, args.slo_tpot)
    _report_lost(arm, results)
    return [
        _row(arm, window, plan, found, samples, scaled, args.slo_tpot)
        for window, plan, found in zip(windows, plans, results, strict=True)
    ]


def _write_requests(
    path: Path,
    phases: Sequence[Phase],
    plans: Sequence[tuple[PlannedRequest, ...]],
    results: Sequence[tuple[CallResult, ...]],
    tpot_slo_s: float,
) -> None:
    """One line per request: its phase, class and lengths, what it got, whether it met its SLOs
    (what a phase's attainment is made of)."""
    lines = []
    for phase, plan, found in zip(phases, plans, results, strict=True):
        for planned, got in zip(plan, outcomes(plan, found, tpot_slo_s), strict=True):
            lines.append(json.dumps({"phase": phase.name, **record(planned, got)}) + "\n")
    path.write_text("".join(lines))


def _report_lost(arm: str, results: Sequence[tuple[CallResult, ...]]) -> None:
    """Why requests did not complete, by status (on stderr: the rows only count them)."""
    lost = Counter(result.status for phase in results for result in phase if not result.ok)
    if lost:
        print(f"{arm}: requests lost by status: {dict(lost)}", file=sys.stderr, flush=True)


def _autoscale_flags(
    args: argparse.Namespace, profile: Path, phases: Sequence[Phase]
) -> tuple[str, ...]:
    """The bench's own SLOs, per request, as it scores them."""
    ttft = tightest_ttft_slo(phases)
    return (
        *("--profile", str(profile), "--pod-cpus", str(args.pod_cpus)),
        *("--slo-attainment", str(args.slo_attainment), "--slo-tpot", str(args.slo_tpot)),
        *("--slo-ttft", str(ttft.seconds), "--slo-ttft-per-token", str(ttft.per_prompt_token)),
        *("--interval-seconds", str(args.interval_seconds), "--max-pods", str(args.max_pods)),
        *("--window-seconds", str(args.window_seconds)),
        *("--lookback-seconds", str(args.lookback_seconds)),
    )


def _stop_autoscaler(autoscaler: Autoscaler) -> list[ScaleRow]:
    code = autoscaler.stop()
    if code != 0:
        print(f"pdserve autoscale exited {code}: {autoscaler.other_lines[-5:]}", file=sys.stderr)
    return autoscaler.rows


def _serve_phases(
    router: str, phases: Sequence[Phase], plans: Sequence[tuple[PlannedRequest, ...]]
) -> tuple[list[Window], list[tuple[CallResult, ...]]]:
    """Each phase's requests at Poisson times within its span (`poisson-window`: with free gaps
    the shipped trace's surge ran 27 s into the high phase and the high phase 9 s into the quiet
    one, whose scale-in was then timed from the wrong start), streams of the previous phase still
    running; all of them to the end, in one event loop."""
    start = time.monotonic()
    windows, offset = [], 0.0
    for phase in phases:
        windows.append(Window(phase, start + offset))
        offset += phase.seconds

    async def serve(index: int) -> tuple[CallResult, ...]:
        await asyncio.sleep(max(0.0, windows[index].start - time.monotonic()))
        seed = index + 1  # each phase its own arrivals, the same for every arm
        rate = len(plans[index]) / phases[index].seconds  # the window: exactly the phase
        config = plan_load(router, plans[index], rate, seed, schedule=LoadSchedule.POISSON_WINDOW)
        return (await drive(config)).results

    async def every_phase() -> list[tuple[CallResult, ...]]:
        return list(await asyncio.gather(*(serve(index) for index in range(len(phases)))))

    return windows, asyncio.run(every_phase())


def _row(
    arm: str,
    window: Window,
    plan: tuple[PlannedRequest, ...],
    results: tuple[CallResult, ...],
    samples: Sequence[Sample],
    scaled: Sequence[ScaleRow],
    tpot_slo_s: float,
) -> PhaseRow:
    found = outcomes(plan, results, tpot_slo_s)
    met = sum(o.meets_slo for o in found)
    events = [
        r
        for r in scaled
        if window.start <= r.at < window.end and r.row["action"].startswith("scale")
    ]
    return PhaseRow(
        arm=arm,
        phase=window.phase.name,
        attainment=met / len(found),
        goodput=met / window.phase.seconds,
        pod_seconds=pod_seconds(samples, window.start, window.end),
        scale_events=len(events),
        streams_migrated=round(
            _migrated_by(samples, window.end) - _migrated_by(samples, window.start)
        ),
        requests_lost=sum(not o.completed for o in found),
        requests=len(found),
        first_scale_down_s=_first_scale_down(window, events),
    )


def _first_scale_down(window: Window, events: Sequence[ScaleRow]) -> float | None:
    downs = [r.at for r in events if r.row["action"] == "scale_down"]
    return round(min(downs) - window.start, 1) if downs else None


def _scaled(row: ScaleRow) -> bool:
    return row.row["action"] in ("scale_up", "scale_down")


def pod_seconds(samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
    """Pods ready per tier integrated over [start, end): each sample's counts hold until the
    next (the last until `end`)."""
    totals = {"prefill": 0.0, "decode": 0.0}
    for sample, following in zip(samples, [*samples[1:], None], strict=True):
        until = end if following is None else following.at
        overlap = min(until, end) - max(sample.at, start)
        if overlap > 0:
            totals["prefill"] += sample.shape.prefill * overlap
            totals["decode"] += sample.shape.decode * overlap
    return {tier: round(seconds, 1) for tier, seconds in totals.items()}


def _migrated_by(samples: Sequence[Sample], at: float) -> float:
    before = [sample.migrated for sample in samples if sample.at <= at]
    return before[-1] if before else 0.0


def _summary(arm: str, rows: Sequence[PhaseRow]) -> dict[str, object]:
    return {
        "arm": arm,
        "pod_seconds_total": round(sum(sum(r.pod_seconds.values()) for r in rows), 1),
        "phases_attained": sum(r.attainment >= ATTAINED for r in rows),
        "phases": len(rows),
        "requests_lost": sum(r.requests_lost for r in rows),
        "min_attainment": min((r.attainment for r in rows), default=math.nan),
    }


def _line(row: PhaseRow) -> str:
    pods = row.pod_seconds
    return (
        f"{row.arm:>9} {row.phase:>11}: attainment {row.attainment:.2f}, goodput "
        f"{row.goodput:.3f} req/s, pod-seconds {pods['prefill']:.0f} P + {pods['decode']:.0f} D, "
        f"{row.scale_events} scale events, {row.streams_migrated} migrated, "
        f"{row.requests_lost} lost of {row.requests}"
    )
