"""The `pdserve` command: one subcommand per module, imported only when it runs.

Each subcommand module defines `add_arguments(parser)` and `run(args) -> int` (commands.py);
`pdserve bench` is a table of its own.
"""

from __future__ import annotations

import argparse
import sys

from pdserve.commands import CommandGroup

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "model": ("pdserve.core.model.cli", "prepare or inspect a model folder"),
    "generate": ("pdserve.generate_cli", "generate text (through the router, or --local)"),
    "bench": ("pdserve.bench.cli", "benchmarks, one door each (pdserve bench --help)"),
    "up": ("pdserve.local.up", "run router + prefill + decode on 127.0.0.1 (or in pods: --netns)"),
    "scale": ("pdserve.local.scale", "change the worker counts of a running `pdserve up --netns`"),
    "selftest": ("pdserve.selftest.cli", "verify the GPU path (--gpu), one JSON report"),
    "router": ("pdserve.router.main", "run the router (public gRPC API)"),
    "prefill": ("pdserve.prefill_service.main", "run a prefill worker"),
    "decode": ("pdserve.decode_service.main", "run a decode worker"),
    "loadtest": ("pdserve.loadtest.runner", "drive load from a ghz config file"),
    "profile": ("pdserve.planner.profile_cli", "measure this engine's step costs (a profile)"),
    "simulate": ("pdserve.planner.simulate_cli", "simulate a deployment from a profile"),
    "autoscale": (
        "pdserve.planner.autoscale_cli",
        "keep a `pdserve up --netns` at the fewest pods that meet the SLOs as the load shifts",
    ),
    "plan": ("pdserve.planner.plan_cli", "size prefill/decode tiers for SLOs; write Helm values"),
}


COMMANDS = CommandGroup("command", SUBCOMMANDS)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdserve", description=__doc__.splitlines()[0])
    COMMANDS.add_to(parser, argv)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return COMMANDS.load(args.command).run(args)


if __name__ == "__main__":
    sys.exit(main())
