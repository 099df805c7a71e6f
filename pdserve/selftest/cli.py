"""`pdserve selftest --gpu`: the GPU path verified in one command, one JSON report.

On one GPU (under 8 minutes): every `gpu`-marked test, greedy on CUDA == transformers, the Triton
decode attention's bandwidth against a device copy, a decode step as a CUDA graph vs eager, and
`pdserve up` with both tiers on the GPU. Without CUDA every check is reported as skipped (exit 0);
any failed check makes the exit status 1. Run it from the source checkout (the tests live there).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from pdserve.core.model.source import resolve_model
from pdserve.selftest import gpu_checks
from pdserve.selftest.gpu_checks import Check, CheckResult, CheckStatus, run_check

DEFAULT_REPORT = Path("gpu_check.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", action="store_true", required=True, help="run the GPU checks")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT, help="JSON report path")
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")
    parser.add_argument(
        "--skip", action="append", default=[], choices=list(CHECK_NAMES), help="leave a check out"
    )


CHECK_NAMES = ("gpu_tests", "greedy_cuda_matches_hf", "attention_bandwidth", "decode_graphs", "up")


def checks(model: str | None, skip: list[str]) -> list[tuple[str, Check]]:
    def model_dir() -> Path:
        return resolve_model(model)

    bodies = {
        "gpu_tests": lambda: gpu_checks.pytest_nodes("tests"),
        "greedy_cuda_matches_hf": lambda: gpu_checks.pytest_nodes(
            "tests/kernels/test_model_gpu.py::test_greedy_tokens_on_the_gpu_equal_transformers"
        ),
        "attention_bandwidth": gpu_checks.attention_bandwidth,
        "decode_graphs": lambda: gpu_checks.decode_step_graphs(model_dir()),
        "up": gpu_checks.up_on_gpu,
    }
    return [
        (name, lambda name=name: run_check(name, bodies[name]))  # type: ignore[misc]
        for name in CHECK_NAMES
        if name not in skip
    ]


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    results = [check() for _, check in checks(args.model, args.skip)]
    report = build_report(results, time.perf_counter() - started)
    write_report(report, args.report)
    for result in results:
        print(f"{result.status.value:8s} {result.name} ({result.seconds:.1f} s)")
    print(f"report: {args.report}")
    return 1 if any(r.status is CheckStatus.FAILED for r in results) else 0


def build_report(results: list[CheckResult], seconds: float) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "cuda_available": cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "seconds": round(seconds, 1),
        "passed": all(r.status is not CheckStatus.FAILED for r in results),
        "checks": [
            asdict(r) | {"status": r.status.value, "seconds": round(r.seconds, 2)} for r in results
        ],
    }


def write_report(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="pdserve selftest")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
