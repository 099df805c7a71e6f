"""`pdserve autoscale --port P --metrics-url URL`: keeps a `pdserve up --netns` at the fewest
pods that meet the SLOs as the load shifts (planner/autoscale.py decides; `pdserve scale`'s
control endpoint applies it; live KV migration makes a scale-in lose nothing).

Every `--interval-seconds` it scrapes the router's metrics, decides, scales when the decision
says so (waiting until the pods are ready or drained) and prints one line: the interval's rate,
streams in flight, what the load wanted, the floor the streams need, the action and the shape.
`--dry-run` decides without scaling; `--intervals N` stops after N decisions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pdserve.core.serving.cli_config import add_engine_arguments, engine_config_from_args
from pdserve.costmodel.profile import ProfileError, load_profile
from pdserve.local.cpu_limit import pod_cpus
from pdserve.local.scale_control import NoClusterError, request_scale
from pdserve.local.status import ClusterStatus, ScaleError
from pdserve.planner.autoscale import Action, Autoscaler, Decision, Observation, Policy, Shape
from pdserve.planner.autoscale_metrics import observation, scrape
from pdserve.planner.plan import Slo
from pdserve.router.placement.prefill_place import PlacementConfig, PlacementMode

SCALES = (Action.SCALE_UP, Action.SCALE_DOWN)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, required=True, help="the `pdserve up --netns` port")
    parser.add_argument(
        "--metrics-url", required=True, help="the router's /metrics (http://ADDRESS:PORT/metrics)"
    )
    parser.add_argument("--profile", type=Path, required=True, help="from `pdserve profile`")
    parser.add_argument("--slo-ttft-p90", type=float, required=True, help="seconds")
    parser.add_argument("--slo-itl-p99", type=float, required=True, help="seconds")
    parser.add_argument("--interval-seconds", type=float, default=15.0)
    parser.add_argument("--headroom", type=float, default=Policy.headroom, help="0.25: +25 %%")
    parser.add_argument("--down-after", type=int, default=Policy.down_after, help="intervals")
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
    try:
        started = _shape(request_scale(args.port, {}, timeout_s=10))
        scaler = _autoscaler(args, colocated=started.prefill == 0)
        last = scrape(args.metrics_url, time.monotonic())
    except (ProfileError, NoClusterError, OSError, ValueError) as error:
        print(f"pdserve autoscale: {error}", file=sys.stderr)
        return 1
    decided = 0
    while not args.intervals or decided < args.intervals:
        time.sleep(args.interval_seconds)
        try:
            now = scrape(args.metrics_url, time.monotonic())
            current = _shape(request_scale(args.port, {}, timeout_s=10))  # whoever scaled it
            _step(args, scaler, observation(last, now), current)
        except (NoClusterError, ScaleError, TimeoutError, OSError) as error:
            print(f"pdserve autoscale: {error}", file=sys.stderr)
            return 1
        last, decided = now, decided + 1
    return 0


def _autoscaler(args: argparse.Namespace, colocated: bool) -> Autoscaler:
    policy = Policy(
        headroom=args.headroom,
        down_after=args.down_after,
        max_pods=args.max_pods,
        pod_share=1.0 if args.pod_cpus is None else min(args.pod_cpus, 1.0),
    )
    placement = PlacementConfig(
        disagg_threshold=args.disagg_threshold, mode=PlacementMode(args.placement)
    )
    slo = Slo(args.slo_ttft_p90, args.slo_itl_p99)
    engine = engine_config_from_args(args)
    return Autoscaler(load_profile(args.profile), engine, placement, slo, policy, colocated)


def _step(args: argparse.Namespace, scaler: Autoscaler, seen: Observation, current: Shape) -> None:
    decision = scaler.decide(seen, current)
    if decision.action in SCALES and not args.dry_run:
        wanted = {"prefill": decision.shape.prefill, "decode": decision.shape.decode}
        current = _shape(request_scale(args.port, wanted, timeout_s=600))
    _print(seen, decision, current)


def _shape(status: ClusterStatus) -> Shape:
    ready = [m for m in status.members if m.state == "ready"]
    return Shape(sum(m.tier == "prefill" for m in ready), sum(m.tier == "decode" for m in ready))


def _print(seen: Observation, decision: Decision, now: Shape) -> None:
    row = {
        "rate": round(seen.rate, 3),
        "in_flight": seen.in_flight,
        "wanted": str(decision.wanted),
        "floor": str(decision.floor),
        "action": decision.action.value,
        "shape": str(now),
    }
    print(json.dumps(row), flush=True)
