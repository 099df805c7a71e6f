"""`pdserve autoscale --metrics-url URL (--port P | --export-port N)`: keeps a deployment at the
fewest pods that meet the SLOs as the load shifts (planner/autoscale.py decides). With `--port`
it scales a `pdserve up --netns` through `pdserve scale`'s control endpoint; with
`--export-port` it serves the replica counts it wants on /metrics for the chart's
HorizontalPodAutoscalers (planner/autoscale_apply.py). Live KV migration makes a scale-in lose
nothing either way.

Every `--interval-seconds` it scrapes the router's metrics, decides on the load of the last
`--lookback-seconds`, or of its newest part (a `--window-seconds` or longer) once the arrival
rate changed there (planner/autoscale_view.py), scales when the decision says so (waiting
until the pods are ready or drained) and prints one line: the view's arrival rate, streams in
flight, what the load wanted at that rate and at its high end (`wanted_upper`, asked when the
mean wanted fewer: planner/autoscale.py), the floor the streams need, the action, the shape,
the factor each tier's simulated pods were corrected by (measured / predicted step time), and
the workers a scale-in drained (`pdserve scale --json`'s departures), and what the view and
the last window held (`seen`, `newest`).
`--dry-run` decides without scaling; `--intervals N` stops after N decisions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

from prometheus_client import start_http_server

from pdserve.core.serving.cli_config import add_engine_arguments, engine_config_from_args
from pdserve.costmodel.profile import ProfileError, load_profile
from pdserve.local.cpu_limit import pod_cpus
from pdserve.local.scale_control import NoClusterError
from pdserve.local.status import Departure, ScaleError
from pdserve.planner.autoscale import Action, Autoscaler, Decision, Policy, Shape
from pdserve.planner.autoscale_apply import Applier, LocalPods, ReplicaGauges
from pdserve.planner.autoscale_metrics import Routers, ScrapeWindow, healthy_workers, scrape
from pdserve.planner.autoscale_observation import Observation
from pdserve.planner.autoscale_view import LOOKBACK_SECONDS, LoadViews
from pdserve.planner.plan import PerRequestSlo, Slo
from pdserve.router.placement.prefill_place import PlacementConfig, PlacementMode

SCALES = (Action.SCALE_UP, Action.SCALE_DOWN)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    apply = parser.add_mutually_exclusive_group(required=True)
    apply.add_argument("--port", type=int, help="scale this `pdserve up --netns` (its port)")
    apply.add_argument(
        "--export-port",
        type=int,
        help="serve the desired replicas per tier on this port's /metrics (Kubernetes: the "
        "chart's HPAs read them); the shape at start is the router's healthy workers",
    )
    parser.add_argument(
        "--colocated",
        action="store_true",
        help="with --export-port: the deployment has no prefill tier (locally it is read from "
        "the cluster)",
    )
    parser.add_argument(
        "--metrics-url",
        required=True,
        help="the router's /metrics (http://HOST:PORT/metrics); every address HOST resolves to "
        "is scraped and summed (on Kubernetes the router's headless Service: every replica)",
    )
    parser.add_argument("--profile", type=Path, required=True, help="from `pdserve profile`")
    percentiles = parser.add_argument_group("SLOs by percentiles (the default form)")
    percentiles.add_argument("--slo-ttft-p90", type=float, help="seconds")
    percentiles.add_argument("--slo-itl-p99", type=float, help="seconds")
    per_request = parser.add_argument_group(
        "SLOs per request, as the benchmarks score them (instead): a request meets them when its "
        "TTFT is within --slo-ttft + --slo-ttft-per-token x its prompt tokens and its mean time "
        "per output token within --slo-tpot; a deployment when --slo-attainment of them do"
    )
    per_request.add_argument("--slo-attainment", type=float, help="0..1, e.g. 0.95")
    per_request.add_argument("--slo-ttft", type=float, help="seconds")
    per_request.add_argument("--slo-ttft-per-token", type=float, default=0.0, help="seconds")
    per_request.add_argument("--slo-tpot", type=float, help="seconds")
    parser.add_argument("--interval-seconds", type=float, default=15.0, help="between decisions")
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=30.0,
        help="the shortest newest part of the lookback a decision may size for (at least an "
        "interval; two by default)",
    )
    parser.add_argument(
        "--lookback-seconds",
        type=float,
        default=LOOKBACK_SECONDS,
        help="the longer view: each decision sizes for the load of this long while its arrivals "
        "read as one steady rate, of its newest part (a --window-seconds or longer) once they "
        "show the rate changed there (planner/autoscale_view.py)",
    )
    parser.add_argument("--headroom", type=float, default=Policy.headroom, help="0.25: +25 %%")
    parser.add_argument("--down-after", type=int, default=Policy.down_after, help="intervals")
    parser.add_argument(
        "--rebalance-after",
        type=int,
        default=Policy.rebalance_after,
        help="decisions in a row that want pods moved between the tiers before they move",
    )
    parser.add_argument("--max-pods", type=int, default=Policy.max_pods, help="prefill + decode")
    parser.add_argument(
        "--placement",
        choices=[mode.value for mode in PlacementMode],
        default=PlacementMode.THRESHOLD.value,
        help="the router's --placement (the simulator places prompts by it)",
    )
    parser.add_argument("--disagg-threshold", type=int, default=0, help="the router's")
    parser.add_argument(
        "--pod-cpus",
        type=pod_cpus,
        default=None,
        help="the pods' CPU limit (pdserve up --pod-cpus): a pod is that share of the profiled "
        "one-core worker, up to 1 (default: 1)",
    )
    parser.add_argument("--dry-run", action="store_true", help="decide, never scale")
    parser.add_argument("--intervals", type=int, default=0, help="stop after N (0: never)")
    add_engine_arguments(parser)  # the workers' settings: the simulated workers run them


def run(args: argparse.Namespace) -> int:
    _stop_on_signals()
    try:
        last = scrape(args.metrics_url, time.monotonic())
        applier = _applier(args, last)
        scaler = _autoscaler(args, colocated=applier.current().prefill == 0)
        if args.colocated and args.port is not None:
            raise ValueError("--colocated: only with --export-port (a local cluster says so)")
    except (ProfileError, NoClusterError, OSError, ValueError) as error:
        print(f"pdserve autoscale: {error}", file=sys.stderr)
        return 1
    try:
        _loop(args, scaler, applier, last)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: a scale in progress goes on in `pdserve up`
        return 0
    except NoClusterError as error:
        print(f"pdserve autoscale: {error}", file=sys.stderr)
        return 1
    return 0


def _stop_on_signals() -> None:
    """Ctrl-C, and SIGTERM (Kubernetes stopping the pod), end the loop wherever it is, with exit
    0. Set here, not left to Python's default: a process started in the background of a
    non-interactive shell inherits SIGINT ignored, and then never stopped on Ctrl-C."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def _applier(args: argparse.Namespace, first: Routers) -> Applier:
    if args.port is not None:
        return LocalPods(args.port)
    healthy = healthy_workers(first)
    prefill = 0 if args.colocated else max(1, healthy.get("prefill", 0))
    start_http_server(args.export_port)
    return ReplicaGauges(Shape(prefill, max(1, healthy.get("decode", 0))))


def _loop(args: argparse.Namespace, scaler: Autoscaler, applier: Applier, first: Routers) -> None:
    seconds = max(args.window_seconds, args.interval_seconds)
    window = ScrapeWindow(seconds, args.lookback_seconds, first)
    decided = 0
    while not args.intervals or decided < args.intervals:
        time.sleep(args.interval_seconds)
        try:
            now = scrape(args.metrics_url, time.monotonic())
            current = applier.current()  # locally: whoever scaled it last
            _step(args, scaler, applier, window.add(now), current)
        except NoClusterError:  # the cluster stopped (a ConnectionError, so before OSError)
            raise
        except (ScaleError, TimeoutError, OSError) as error:  # this interval's; the next retries
            print(f"pdserve autoscale: {error}", file=sys.stderr, flush=True)
            continue
        decided += 1


def _autoscaler(args: argparse.Namespace, colocated: bool) -> Autoscaler:
    policy = Policy(
        headroom=args.headroom,
        down_after=args.down_after,
        rebalance_after=args.rebalance_after,
        max_pods=args.max_pods,
        pod_share=1.0 if args.pod_cpus is None else min(args.pod_cpus, 1.0),
    )
    placement = PlacementConfig(
        disagg_threshold=args.disagg_threshold, mode=PlacementMode(args.placement)
    )
    slo = slo_from_args(args)
    engine = engine_config_from_args(args)
    return Autoscaler(load_profile(args.profile), engine, placement, slo, policy, colocated)


def slo_from_args(args: argparse.Namespace) -> Slo:
    """One form of the two: percentiles, or per request (ValueError naming the flags)."""
    if args.slo_attainment is None:
        if args.slo_ttft_p90 is None or args.slo_itl_p99 is None:
            raise ValueError("--slo-ttft-p90 and --slo-itl-p99, or --slo-attainment: one is needed")
        return Slo(args.slo_ttft_p90, args.slo_itl_p99)
    if args.slo_ttft_p90 is not None or args.slo_itl_p99 is not None:
        raise ValueError("--slo-attainment: not with --slo-ttft-p90 / --slo-itl-p99 (one form)")
    if args.slo_ttft is None or args.slo_tpot is None:
        raise ValueError("--slo-attainment: needs --slo-ttft and --slo-tpot")
    if not 0 < args.slo_attainment <= 1:
        raise ValueError(f"--slo-attainment: must be in (0, 1], got {args.slo_attainment}")
    per_request = PerRequestSlo(
        args.slo_ttft, args.slo_ttft_per_token, args.slo_tpot, args.slo_attainment
    )
    return Slo(args.slo_ttft, args.slo_tpot, per_request)


def _step(
    args: argparse.Namespace,
    scaler: Autoscaler,
    applier: Applier,
    views: LoadViews,
    current: Shape,
) -> None:
    seen, newest = views.steady(), views.spans[0]
    decision = scaler.decide(seen, current, newest)
    applier.record(decision)
    departures: tuple[Departure, ...] = ()
    if decision.action in SCALES and not args.dry_run:
        current, departures = applier.apply(decision.shape)
    _print(seen, newest, decision, current, departures)


def _print(
    seen: Observation,
    newest: Observation,
    decision: Decision,
    now: Shape,
    departures: tuple[Departure, ...],
) -> None:
    row = {
        "rate": round(seen.rate, 3),
        "in_flight": seen.in_flight,
        "wanted": str(decision.wanted),
        "wanted_upper": None if decision.wanted_upper is None else str(decision.wanted_upper),
        "floor": str(decision.floor),
        "action": decision.action.value,
        "shape": str(now),
        "correction": {
            "prefill": round(decision.correction.prefill, 3),
            "decode": round(decision.correction.decode, 3),
        },
        "departures": [dataclasses.asdict(departure) for departure in departures],
        "seen": seen_record(seen),
        "newest": seen_record(newest),
    }
    print(json.dumps(row), flush=True)


def seen_record(seen: Observation) -> dict[str, object]:
    """What the decision was sized from, less the step windows (the correction above sums
    them): with it a decision can be simulated again, e.g. to find why it wanted what it did."""
    return {
        "seconds": round(seen.seconds, 3),
        "arrivals": seen.arrivals,
        "prompt_tokens": dataclasses.asdict(seen.prompt_tokens),
        "output_tokens": dataclasses.asdict(seen.output_tokens),
        "pending_prompt_tokens": seen.pending_prompt_tokens,
    }
