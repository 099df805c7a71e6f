"""`pdserve scale`: change the worker counts of a running `pdserve up --netns`, as `kubectl scale`.

New workers join through DNS once ready and take traffic; removed ones leave DNS, then get
SIGTERM and drain (docs/elasticity.md). Waits until the counts are reached and prints who is
serving and how long each removed worker's drain took. Without `--prefill` and `--decode` it
prints the status only.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from pdserve.local.scale_control import NoClusterError, request_scale
from pdserve.local.status import ClusterStatus, ScaleError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port", type=int, required=True, help="the router port of the `pdserve up --netns`"
    )
    parser.add_argument("--prefill", type=int, default=None, help="prefill workers wanted")
    parser.add_argument("--decode", type=int, default=None, help="decode workers wanted")
    parser.add_argument(
        "--timeout-seconds",
        type=float,
        default=600.0,
        help="how long to wait for the new counts (model loads and drains included)",
    )
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args: argparse.Namespace) -> int:
    desired = {
        tier: count
        for tier, count in (("prefill", args.prefill), ("decode", args.decode))
        if count is not None
    }
    try:
        status = request_scale(args.port, desired, args.timeout_seconds)
    except (NoClusterError, ScaleError, TimeoutError) as error:
        print(f"pdserve scale: {error}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(status), indent=2) if args.json else describe(status))
    return 0


def describe(status: ClusterStatus) -> str:
    lines = [
        f"{tier}: {status.ready(tier)} ready of {count} wanted"
        for tier, count in status.desired.items()
    ]
    lines += [f"  {m.name:<12} {m.address:<22} {m.state}" for m in status.members]
    for gone in status.departures:
        if gone.drain_seconds is None:
            how = "died"
        elif gone.killed:
            how = f"killed after {gone.drain_seconds:.2f} s (past its drain grace)"
        else:
            how = f"drained in {gone.drain_seconds:.2f} s"
        lines.append(f"  {gone.name:<12} {gone.address:<22} left: {how}, exit {gone.exit_code}")
    return "\n".join(lines)
