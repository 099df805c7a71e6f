"""`pdserve bench offline`: output tokens/s of continuous vs static batching vs transformers.

Modes: the throughput run (default), `--batch1-decode` (decode step vs the memory-bandwidth
floor) and `--profile` (where the continuous engine's steps spend their time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TypeVar

import torch

from pdserve.bench.arg_types import positive_int, positive_ints
from pdserve.bench.offline import context_growth
from pdserve.bench.offline import decode as offline_decode
from pdserve.bench.offline import profile_report as offline_profile_report
from pdserve.bench.offline import report as offline_report
from pdserve.bench.offline.bounds import measure_bounds
from pdserve.bench.offline.engines import (
    EngineKind,
    EngineRun,
    Precision,
    load_engine,
    time_run,
)
from pdserve.bench.offline.workload import (
    WORKLOAD_DIR,
    WorkloadRequest,
    workload_and_model,
)
from pdserve.core.kv.cache import DTYPES
from pdserve.core.model.precision import QUANTIZATIONS

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        type=Path,
        default=WORKLOAD_DIR / "mixed.json",
        help="JSON list of {prompt: [token ids], max_tokens: N} (default: mixed)",
    )
    parser.add_argument(
        "--engine",
        action="append",
        type=_engines,
        metavar="LIST",
        help="continuous, static, hf; repeatable or comma list (default: continuous)",
    )
    parser.add_argument(
        "--max-batch",
        action="append",
        type=positive_ints,
        metavar="LIST",
        help="max_num_seqs for ours, batch size for static and hf (default: 16)",
    )
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")
    parser.add_argument("--repeat", type=positive_int, default=1, help="timed passes per engine")
    parser.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPES), help="ours: model/KV dtype"
    )
    parser.add_argument(
        "--quantization", default="none", choices=QUANTIZATIONS, help="ours: weight quantization"
    )
    parser.add_argument(
        "--threads", type=positive_int, help="torch.set_num_threads (default: torch's)"
    )
    parser.add_argument("--compare", action="store_true", help="print the engines' ratios")
    parser.add_argument("--json", action="store_true", help="one JSON object per run on stdout")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="tokens/s against max batch")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--batch1-decode",
        action="store_true",
        help="batch-1 decode step time vs weights / measured memory bandwidth",
    )
    mode.add_argument(
        "--profile",
        action="store_true",
        help="time the parts of the continuous engine's steps over the workload, each beside the "
        "floor of the bytes and flops it must handle (one profile per --max-batch)",
    )
    mode.add_argument(
        "--context-growth",
        type=positive_ints,
        metavar="LIST",
        help="decode step time at these context lengths (each --max-batch): does only the "
        "attention grow?",
    )
    parser.add_argument(
        "--num-requests",
        type=positive_int,
        help="--profile: the workload's first N requests (default: all)",
    )
    parser.add_argument(
        "--decode-steps",
        type=positive_int,
        default=128,
        help="decode steps timed by --batch1-decode and at each --context-growth point",
    )


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    inputs = workload_and_model(args.workload, args.model)
    if inputs is None:
        return 2
    workload, model_dir = inputs
    engines = _flatten(args.engine) or [EngineKind.CONTINUOUS]
    batches = _flatten(args.max_batch) or [16]
    if args.batch1_decode:
        result = offline_decode.measure_batch1_decode(
            model_dir, list(workload[0].prompt), args.decode_steps, _precision(args)
        )
        print(offline_decode.report(result))
        return 0
    if args.profile:
        _profile(args, model_dir, workload, batches)
        return 0
    if args.context_growth:
        _context_growth(args, model_dir, batches)
        return 0
    runs = _throughput(args, model_dir, workload, engines, batches)
    _report(args, runs)
    return 0


def _profile(
    args: argparse.Namespace,
    model_dir: Path,
    workload: list[WorkloadRequest],
    batches: list[int],
) -> None:
    """Per max batch, the first `--num-requests` requests (all by default), each part beside
    its floor on this host's bounds, measured first."""
    bounds = measure_bounds()
    print(offline_profile_report.bounds_report(bounds))
    requests = workload[: args.num_requests]
    for max_batch in batches:
        load = os.getloadavg()[0]
        precision = _precision(args)
        groups = offline_profile_report.profile_workload(model_dir, requests, max_batch, precision)
        print(
            f"\nprofile: continuous, B={max_batch}, {precision.label}, {args.workload.name}, "
            f"{len(requests)} requests, load average {load:.2f} before"
        )
        print(offline_profile_report.profile_report(groups, bounds))


def _context_growth(args: argparse.Namespace, model_dir: Path, batches: list[int]) -> None:
    precision = _precision(args)
    points = []
    for batch in batches:
        for context in sorted(args.context_growth):
            point = context_growth.measure_point(
                model_dir, context, batch, args.decode_steps, precision
            )
            points.append(point)
            if args.json:
                print(json.dumps(context_growth.as_record(point, precision)), flush=True)
    print(context_growth.report(points), file=sys.stderr if args.json else sys.stdout)


def _throughput(
    args: argparse.Namespace,
    model_dir: Path,
    workload: list[WorkloadRequest],
    engines: list[EngineKind],
    batches: list[int],
) -> list[EngineRun]:
    """Per max batch: load every engine, then time them in turn, `--repeat` rounds."""
    log = sys.stderr if args.json else sys.stdout
    precision = _precision(args)
    extra = {"threads": torch.get_num_threads(), "weights": precision.label}
    runs = []
    for max_batch in batches:
        loaded = [load_engine(kind, model_dir, workload, max_batch, precision) for kind in engines]
        for repeat in range(args.repeat):
            for engine in loaded:
                load_1m = os.getloadavg()[0]
                run = time_run(engine, workload, repeat)
                runs.append(run)
                print(offline_report.run_line(run), file=log, flush=True)
                if args.json:
                    record = extra | {"loadavg_1m_before": round(load_1m, 2)}
                    print(offline_report.json_line(run, args.workload.name, record), flush=True)
        del loaded
    return runs


def _report(args: argparse.Namespace, runs: list[EngineRun]) -> None:
    log = sys.stderr if args.json else sys.stdout
    summaries = offline_report.summarize(runs)
    print(offline_report.summary_table(summaries), file=log)
    if args.compare:
        print("ratios of mean tokens/s, measured side by side in this run:", file=log)
        print(offline_report.ratio_table(summaries), file=log)
    if args.plot:
        offline_report.plot(summaries, args.plot, f"offline throughput, {args.workload.name}")
        print(f"plot: {args.plot}", file=log)


def _precision(args: argparse.Namespace) -> Precision:
    return Precision(args.dtype, args.quantization)


def _engines(text: str) -> list[EngineKind]:
    try:
        return [EngineKind(name.strip()) for name in text.split(",") if name.strip()]
    except ValueError as error:
        choices = ", ".join(kind.value for kind in EngineKind)
        raise argparse.ArgumentTypeError(f"--engine: {error}; choose from {choices}") from error


def _flatten(lists: list[list[T]] | None) -> list[T]:
    return [item for items in lists or [] for item in items]
