"""`pdserve bench disagg`: colocated vs disaggregated vs conditional on the same two cores.

The methodology of vLLM's disaggregated-prefill benchmark, on this machine's budget of 2 cores:
every arm gets the same two worker processes' worth of CPU, one core each, one torch thread each
(`CpuPin`); the router and the load generator run beside them, unpinned.

    colocated      2 decode workers (core 0, core 1), no prefill tier: each prefills its own
                   requests inside its continuous batch (chunked prefill)
    disaggregated  1 prefill worker (core 0) + 1 decode worker (core 1); every prompt remote
    conditional    the same two workers; prompts shorter than --threshold are prefilled on decode

Each arm serves the same Poisson arrivals (fixed seed) of the same request mix at each rate,
streamed through the router by the load runner; the report is TTFT and ITL percentiles and the
goodput (requests/s that met both SLOs: TTFT and mean ITL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from pdserve.bench.disagg.arms import ARMS, Arm, running_arm
from pdserve.bench.disagg.report import ArmResult, plot_results, print_table
from pdserve.bench.disagg.workload import call_data, load_spec
from pdserve.loadtest.config import DurationStop, LoadConfig, Method
from pdserve.loadtest.driver import drive
from pdserve.loadtest.report import GoodputTargets, build_report
from pdserve.loadtest.schedule import LoadSchedule


@dataclass(frozen=True)
class BenchSettings:
    rates: tuple[float, ...]
    duration_s: float
    targets: GoodputTargets
    threshold: int
    chunk_tokens: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF model folder (default: embedded)")
    parser.add_argument("--workload", type=Path, default=None, help="request mix SPEC (JSON)")
    parser.add_argument("--rates", default="0.2,0.4,0.6,0.8", help="requests/s, comma-separated")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals a rate")
    parser.add_argument("--arms", default=",".join(ARMS), help="which arms, comma-separated")
    parser.add_argument("--threshold", type=int, default=512, help="conditional arm's threshold")
    parser.add_argument("--chunk", type=int, default=512, help="max tokens a step (chunking)")
    parser.add_argument("--slo-ttft", type=float, default=4.0, help="TTFT SLO, seconds")
    parser.add_argument("--slo-itl", type=float, default=0.1, help="mean ITL SLO, seconds")
    parser.add_argument("--json", action="store_true", help="one JSON object per arm and rate")
    parser.add_argument("--plot", type=Path, default=None, help="write the PNG here")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep worker logs here")


def run(args: argparse.Namespace) -> int:
    from pdserve.core.model.config import load_model_config
    from pdserve.core.model.source import resolve_model

    try:
        rates = tuple(float(r) for r in args.rates.split(","))
        arms = [ARMS[name] for name in args.arms.split(",")]
        classes = load_spec(args.workload)
    except (ValueError, KeyError) as error:
        print(f"pdserve bench disagg: {error}", file=sys.stderr)
        return 2
    model_dir = resolve_model(args.model)
    vocab_size = load_model_config(model_dir).vocab_size
    settings = BenchSettings(
        rates,
        args.duration,
        GoodputTargets(args.slo_ttft, args.slo_itl),
        args.threshold,
        args.chunk,
    )
    count = int(max(rates) * args.duration * 2) + 16  # more than any rate can start
    data = call_data(classes, count, vocab_size)
    results: list[ArmResult] = []
    for arm in arms:
        results.extend(_run_arm(arm, model_dir, data, settings, args.log_dir, args.json))
    if not args.json:
        print_table(results, settings.targets)
    if args.plot is not None:
        plot_results(results, args.plot)
    return 0


def _run_arm(
    arm: Arm,
    model_dir: Path,
    data: tuple[dict[str, object], ...],
    settings: BenchSettings,
    log_dir: Path | None,
    as_json: bool,
) -> list[ArmResult]:
    results = []
    with running_arm(arm, model_dir, settings.threshold, settings.chunk_tokens, log_dir) as host:
        for rate in settings.rates:
            config = LoadConfig(
                method=Method.GENERATE_STREAM,
                host=host,
                data=data,
                rps=rate,
                load_schedule=LoadSchedule.POISSON,
                duration_s=settings.duration_s,
                duration_stop=DurationStop.WAIT,  # every started request finishes and counts
                concurrency=len(data),  # open loop: no worker is ever the bottleneck
                timeout_s=900.0,
                insecure=True,
            )
            report = build_report(config, asyncio.run(drive(config)), settings.targets)
            result = ArmResult.from_report(arm.name, rate, report)
            print(json.dumps(asdict(result)) if as_json else f"  {result.line()}", flush=True)
            results.append(result)
    return results
