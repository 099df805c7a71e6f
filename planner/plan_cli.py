"""`pdserve plan --profile FILE --workload SPEC --rate R --slo-ttft-p90 S --slo-itl-p99 S
--out values.yaml`: the cheapest deployment that meets the SLOs, as Helm values for helm/pdserve.

`--verify` then runs the chosen deployment on this machine at the planned rate and prints what
was predicted beside what happened (planner/verify.py); `--json` prints that (or, without
`--verify`, the plan) as one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import yaml

from pdserve.core.model.source import resolve_model
from pdserve.core.serving.cli_config import add_engine_arguments, engine_config_from_args
from pdserve.costmodel.profile import ProfileError, load_profile
from pdserve.planner.helm_values import helm_values
from pdserve.planner.plan import (
    TABLE_HEADER,
    Candidate,
    SearchSpace,
    Slo,
    format_row,
    search,
)
from pdserve.planner.real_runs import log_folder
from pdserve.planner.verify import verify
from pdserve.planner.workload import (
    PoissonSpec,
    TraceRequest,
    Workload,
    WorkloadSpecError,
    load_spec,
    requests_of,
)
from pdserve.router.placement.prefill_place import PlacementMode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", type=Path, required=True, help="from `pdserve profile`")
    parser.add_argument("--workload", type=Path, required=True, help="JSONL trace or Poisson JSON")
    parser.add_argument("--rate", type=float, required=True, help="target requests per second")
    parser.add_argument("--slo-ttft-p90", type=float, required=True, help="seconds")
    parser.add_argument("--slo-itl-p99", type=float, required=True, help="seconds")
    parser.add_argument("--out", type=Path, required=True, help="Helm values file to write")
    parser.add_argument("--peak-rate", type=float, help="rate the HPAs' maxReplicas cover (2x)")
    parser.add_argument("--max-workers", type=int, default=16, help="largest total to try")
    parser.add_argument(
        "--placements",
        default=PlacementMode.THRESHOLD.value,
        help="router placements to try, comma-separated: threshold, adaptive (docs/router.md)",
    )
    parser.add_argument(
        "--admission",
        choices=["off", "predict"],
        default="off",
        help="predict: the router refuses requests predicted to miss the SLOs (docs/admission.md);"
        " a candidate meets them when its admitted requests do and it refused <= --max-refused",
    )
    parser.add_argument("--max-refused", type=float, default=0.02, help="with --admission predict")
    parser.add_argument("--verify", action="store_true", help="run the plan here and compare")
    parser.add_argument("--json", action="store_true", help="one JSON object, no table")
    parser.add_argument("--model", help="model folder for --verify's workers (default: SmolLM2)")
    parser.add_argument("--log-dir", type=Path, help="keep --verify's worker logs here")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        _check_positive(args)
        placement_modes(args.placements)
        profile = load_profile(args.profile)
        requests = at_rate(load_spec(args.workload), args.rate)
    except (ProfileError, WorkloadSpecError, ValueError) as error:
        print(f"pdserve plan: {error}", file=sys.stderr)
        return 2
    slo = Slo(args.slo_ttft_p90, args.slo_itl_p99)
    space = SearchSpace(
        max_workers=args.max_workers,
        placements=placement_modes(args.placements),
        admission=args.admission == "predict",
        max_refused=args.max_refused,
    )
    if not args.json:
        print(TABLE_HEADER, flush=True)
    progress = (lambda candidate: None) if args.json else _print_row
    result = search(profile, requests, slo, engine_config_from_args(args), space, progress)
    if result.best is None:
        print(f"pdserve plan: no deployment of up to {args.max_workers} workers meets the SLOs")
        return 1
    peak = args.peak_rate if args.peak_rate is not None else 2 * args.rate
    values = helm_values(result.best, args.rate, peak)
    header = (
        f"# pdserve plan: {result.best.deployment.name} at {args.rate} req/s, TTFT p90 <= "
        f"{args.slo_ttft_p90} s, ITL p99 <= {args.slo_itl_p99} s (profile {args.profile.name})\n"
    )
    args.out.write_text(header + yaml.safe_dump(values, sort_keys=False))
    if args.verify:
        model_dir = resolve_model(args.model)
        with log_folder(args.log_dir, "plan-verify") as log_dir:
            checked = verify(result.best, profile, requests, args.rate, slo, model_dir, log_dir)
        print(json.dumps(checked) if args.json else f"verify: {checked}", flush=True)
    elif args.json:
        print(json.dumps(_plan_json(result.best, args.out)))
    if not args.json:
        print(f"plan: {format_row(result.best)}\nwrote {args.out}")
    return 0


def _plan_json(best: Candidate, out: Path) -> dict[str, object]:
    return {
        "plan": best.deployment.name,
        "ttft_p90": best.ttft_p90,
        "itl_p99": best.itl_p99,
        "meets_slo_predicted": best.meets,
        "values": str(out),
    }


def _print_row(candidate: Candidate) -> None:
    print(format_row(candidate), flush=True)


def _check_positive(args: argparse.Namespace) -> None:
    for flag in ("rate", "slo_ttft_p90", "slo_itl_p99", "max_workers"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')}: must be > 0")
    if args.peak_rate is not None and args.peak_rate < args.rate:
        raise ValueError("--peak-rate: must be >= --rate")
    if args.verify and args.max_workers > len(os.sched_getaffinity(0)):
        cores = len(os.sched_getaffinity(0))
        raise ValueError(
            f"--max-workers: --verify runs one worker a core; this machine has {cores}"
        )


def placement_modes(names: str) -> tuple[PlacementMode, ...]:
    try:
        return tuple(PlacementMode(name) for name in names.split(","))
    except ValueError:
        choices = ", ".join(mode.value for mode in PlacementMode)
        raise ValueError(f"--placements: each must be one of {choices}, got {names!r}") from None


def at_rate(workload: Workload, rate: float) -> list[TraceRequest]:
    """The workload at `rate`: a Poisson SPEC's own rate replaced; a trace's arrivals rescaled."""
    if isinstance(workload, PoissonSpec):
        return workload.with_rate(rate).requests()
    requests = requests_of(workload)
    span = requests[-1].arrival_s - requests[0].arrival_s
    if span <= 0:
        raise WorkloadSpecError("workload: a trace needs arrivals spread over time to rescale")
    stretch = (len(requests) - 1) / span / rate
    return [dataclasses.replace(r, arrival_s=r.arrival_s * stretch) for r in requests]
