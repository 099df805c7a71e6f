"""`pdserve loadtest CONFIG`: drive the public API from a ghz config file, write a ghz report.

Reads the same JSON config files as ghz (loadtest/*.json), runs the calls with grpc.aio at the
configured concurrency / rate / count / duration, shows progress on stderr and writes a
ghz-format JSON report with token-level metrics added. `--sweep 1,2,4` runs the config once per
rate and `--plot` then draws latency percentiles against offered load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pdserve.loadtest.config import LoadConfig, LoadConfigError, load_config
from pdserve.loadtest.driver import drive
from pdserve.loadtest.plot import plot_report, plot_sweep
from pdserve.loadtest.progress import Progress
from pdserve.loadtest.report import GoodputTargets, build_report
from pdserve.loadtest.sweep import parse_rates, sweep, sweep_document


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="ghz JSON config file (e.g. loadtest/*.json)")
    parser.add_argument("-o", "--output", type=Path, help="report path (default: stdout)")
    parser.add_argument(
        "--plot", type=Path, help="PNG: latency percentiles, or latency against load (--sweep)"
    )
    parser.add_argument("--host", help="override the config's host (host:port)")
    parser.add_argument("-c", "--concurrency", type=int, help="override concurrency")
    parser.add_argument("-n", "--total", type=int, help="override total")
    parser.add_argument("-r", "--rps", type=int, help="override rps (0: no rate limit)")
    parser.add_argument("-z", "--duration", help="override duration (Go syntax: 10s, 1m)")
    parser.add_argument("--sweep", metavar="RATES", help="run once per rate, e.g. 1,2,4,8")
    parser.add_argument("--ttft-target-ms", type=float, help="goodput: time-to-first-token target")
    parser.add_argument("--itl-target-ms", type=float, help="goodput: inter-token latency target")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, _overrides(args))
        targets = _targets(args)
        rates = parse_rates(args.sweep) if args.sweep else None
    except LoadConfigError as error:
        print(f"pdserve loadtest: {error}", file=sys.stderr)
        return 2
    progress_stream = None if args.quiet else sys.stderr
    document = asyncio.run(_execute(config, rates, targets, args.plot, progress_stream))
    _write_json(document, args.output)
    return 0


async def _execute(
    config: LoadConfig,
    rates: tuple[float, ...] | None,
    targets: GoodputTargets,
    plot_path: Path | None,
    progress_stream: Any,
) -> dict[str, Any]:
    if rates is not None:
        points = await sweep(config, rates, targets, progress_stream)
        if plot_path is not None:
            plot_sweep(points, plot_path)
        document: dict[str, Any] = sweep_document(points)
        return document
    outcome = await drive(config, Progress(progress_stream), interruptible=True)
    report: dict[str, Any] = build_report(config, outcome, targets)
    if plot_path is not None:
        plot_report(report, plot_path)
    return report


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    flags = {"host": args.host, "concurrency": args.concurrency, "total": args.total}
    flags |= {"rps": args.rps, "duration": args.duration}
    return {key: value for key, value in flags.items() if value is not None}


def _targets(args: argparse.Namespace) -> GoodputTargets:
    for flag, value in (
        ("--ttft-target-ms", args.ttft_target_ms),
        ("--itl-target-ms", args.itl_target_ms),
    ):
        if value is not None and value <= 0:
            raise LoadConfigError(f"{flag}: must be > 0, got {value}")
    return GoodputTargets(
        ttft_s=None if args.ttft_target_ms is None else args.ttft_target_ms / 1000,
        itl_s=None if args.itl_target_ms is None else args.itl_target_ms / 1000,
    )


def _write_json(document: dict[str, Any], path: Path | None) -> None:
    text = json.dumps(document, indent=2) + "\n"
    if path is None:
        sys.stdout.write(text)
    else:
        path.write_text(text)
