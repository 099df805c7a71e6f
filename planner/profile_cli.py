"""`pdserve profile --out FILE [--model PATH]`: measure this engine, fit its cost model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.model.source import resolve_model
from pdserve.planner.measure import measure, pin_to
from pdserve.planner.profile import FEATURES, fit_r2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    parser.add_argument("--model", help="local HF model folder (default: the embedded SmolLM2)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    parser.add_argument("--dtype", default="float32", help="model and KV dtype")
    parser.add_argument("--cpu", type=int, default=0, help="core to pin to (cpu device only)")
    parser.add_argument("--repeats", type=int, default=2, help="times each scenario runs")


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        print("pdserve profile: --repeats: must be >= 1", file=sys.stderr)
        return 2
    if args.device == "cpu":
        pin_to(args.cpu)
    config = EngineConfig(
        num_kv_blocks=1024, num_swap_blocks=64, dtype=args.dtype, device=args.device
    )
    profile = measure(resolve_model(args.model), config, args.repeats)
    profile.save(args.out)
    terms = ", ".join(
        f"{name} {value * 1e3:.4g} ms"
        for name, value in zip(FEATURES, profile.model.coefficients, strict=True)
    )
    r2 = fit_r2(profile, profile.samples)
    print(
        f"{len(profile.samples)} steps measured; fitted per unit: {terms}; "
        f"wall/CPU {profile.contention:.2f}; R^2 against wall times {r2:.3f}"
    )
    print(f"wrote {args.out}")
    return 0
