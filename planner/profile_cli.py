"""`pdserve profile --out FILE [--model PATH] [--serving]`: measure this engine, fit its cost
model; with `--serving`, also measure what serving adds per step and token through real workers
(planner/serving_calibration.py). `--from PROFILE` keeps an existing offline fit and only adds
the serving costs."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.model.source import resolve_model
from pdserve.costmodel.profile import FEATURES, Profile, fit_r2, load_profile
from pdserve.planner.measure import measure, pin_to
from pdserve.planner.real_runs import log_folder
from pdserve.planner.serving_calibration import BURSTS, calibrate

ALL_CPUS = frozenset(os.sched_getaffinity(0))  # before the offline profile pins this process


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    parser.add_argument("--model", help="local HF model folder (default: the embedded SmolLM2)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    parser.add_argument("--dtype", default="float32", help="model and KV dtype")
    parser.add_argument("--cpu", type=int, default=0, help="core to pin to (cpu device only)")
    parser.add_argument("--repeats", type=int, default=2, help="times each scenario runs")
    parser.add_argument(
        "--serving", action="store_true", help="also calibrate serving costs (real 1P1D on 2 cores)"
    )
    parser.add_argument("--from", dest="base", type=Path, help="offline profile to start from")
    parser.add_argument(
        "--bursts",
        default=",".join(map(str, BURSTS)),
        help="--serving: burst sizes to calibrate on, comma list, two or more "
        f"(default: {','.join(map(str, BURSTS))})",
    )
    parser.add_argument("--log-dir", type=Path, help="keep the serving run's worker logs here")


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        print("pdserve profile: --repeats: must be >= 1", file=sys.stderr)
        return 2
    bursts = _burst_sizes(args.bursts)
    if bursts is None:
        print(
            f"pdserve profile: --bursts: two or more sizes >= 1 fit a line, got {args.bursts!r}",
            file=sys.stderr,
        )
        return 2
    model_dir = resolve_model(args.model)
    profile = load_profile(args.base) if args.base else _measure_offline(args, model_dir)
    if args.serving:
        with log_folder(args.log_dir, "serving") as log_dir:
            serving = calibrate(model_dir, profile, EngineConfig(), log_dir, bursts)
        profile = replace(profile, serving=serving)
        print(
            f"serving: per step {serving.per_step_s * 1e3:.2f} ms, per streamed token "
            f"{serving.per_token_s * 1e3:.2f} ms, dispatch {serving.dispatch_s * 1e3:.1f} ms"
        )
    profile.save(args.out)
    print(f"wrote {args.out}")
    return 0


def _burst_sizes(text: str) -> list[int] | None:
    """The distinct sizes of a comma list, or None unless they are two or more, each >= 1."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        return None
    return sizes if len(sizes) >= 2 and sizes[0] >= 1 else None


def _measure_offline(args: argparse.Namespace, model_dir: Path) -> Profile:
    if args.device == "cpu":
        pin_to(args.cpu)
    config = EngineConfig(
        num_kv_blocks=1024, num_swap_blocks=64, dtype=args.dtype, device=args.device
    )
    profile = measure(model_dir, config, args.repeats)
    terms = ", ".join(
        f"{name} {value * 1e3:.4g} ms"
        for name, value in zip(FEATURES, profile.model.coefficients, strict=True)
    )
    r2 = fit_r2(profile, profile.samples)
    print(
        f"{len(profile.samples)} steps measured; fitted per unit: {terms}; "
        f"wall/CPU {profile.contention:.2f}; R^2 against wall times {r2:.3f}"
    )
    if args.device == "cpu":
        os.sched_setaffinity(0, ALL_CPUS)  # the serving run pins its own workers
    return profile
