"""`pdserve simulate --profile FILE --workload SPEC --prefill P --decode D [--json]`: simulate a
deployment; with `--validate`, measure the simulator against the real cluster on this machine.

Engine flags (`--max-num-seqs`, `--max-num-batched-tokens`, `--num-kv-blocks`, ...) are the
workers' own (same names, same defaults, same `PDSERVE_*` env), applied to every simulated worker.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pdserve.core.serving.cli_config import add_engine_arguments, engine_config_from_args
from pdserve.costmodel.profile import Profile, ProfileError, load_profile
from pdserve.planner.sim_cluster import ClusterSim, Deployment
from pdserve.planner.sim_report import format_summary, plot, summarize
from pdserve.planner.workload import Workload, WorkloadSpecError, load_spec, requests_of
from pdserve.router.placement.prefill_place import PlacementConfig

PLACEMENT_DEFAULTS = PlacementConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", type=Path, required=True, help="from `pdserve profile`")
    parser.add_argument("--workload", type=Path, required=True, help="JSONL trace or Poisson JSON")
    parser.add_argument("--prefill", type=int, default=1, help="prefill workers (0: colocated)")
    parser.add_argument("--decode", type=int, default=1, help="decode workers")
    parser.add_argument(
        "--disagg-threshold",
        type=int,
        default=PLACEMENT_DEFAULTS.disagg_threshold,
        help="prompts shorter than this many tokens are prefilled on decode (0: none), as the "
        "router's flag",
    )
    parser.add_argument(
        "--max-prefill-queue",
        type=int,
        default=PLACEMENT_DEFAULTS.max_prefill_queue,
        help="prefill calls in flight per prefill worker at which long prompts go to decode too "
        "(0: never), as the router's flag (same default)",
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object (lines with --validate)"
    )
    parser.add_argument(
        "--plot", type=Path, help="PNG: latency, KV and queues over time (--validate: sim vs real)"
    )
    validate = parser.add_argument_group("validation (runs the real router + workers here)")
    validate.add_argument("--validate", action="store_true", help="compare with real runs")
    validate.add_argument("--model", help="model folder for the real workers (default: SmolLM2)")
    validate.add_argument("--rates", help="requests/s, comma-separated (default: 1,2,3)")
    validate.add_argument("--configs", default="1P1D,1P2D,2P1D", help="real configurations to run")
    validate.add_argument("--traffic-s", type=float, default=30.0, help="seconds of load per run")
    validate.add_argument("--repeats", type=int, default=3, help="runs per rate, fresh prompts")
    validate.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT SLO (attainment), s")
    validate.add_argument("--slo-tpot", type=float, default=0.2, help="TPOT SLO (attainment), s")
    validate.add_argument("--out-dir", type=Path, help="keep worker logs here")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        profile = load_profile(args.profile)
        workload = load_spec(args.workload)
        engine = engine_config_from_args(args)
        placement = PlacementConfig(args.disagg_threshold, args.max_prefill_queue)
        deployment = Deployment(args.prefill, args.decode, engine, engine, placement)
    except (ProfileError, WorkloadSpecError, ValueError) as error:
        print(f"pdserve simulate: {error}", file=sys.stderr)
        return 2
    if args.validate:
        from pdserve.planner.validate_cli import run_validation

        try:
            return run_validation(args, profile, workload, engine)
        except ValueError as error:
            print(f"pdserve simulate: {error}", file=sys.stderr)
            return 2
    return _simulate(args, profile, workload, deployment)


def _simulate(
    args: argparse.Namespace, profile: Profile, workload: Workload, deployment: Deployment
) -> int:
    requests = requests_of(workload)
    started = time.perf_counter()
    result = ClusterSim(deployment, profile).run(requests)
    wall = time.perf_counter() - started
    summary = {"config": deployment.name, **summarize(result), "wall_s": wall}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{deployment.name}: simulated {result.end_s:.1f} s in {wall:.2f} s")
        print(format_summary(summary))
    if args.plot:
        plot(result, args.plot)
    return 0
