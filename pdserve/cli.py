"""The `pdserve` command: one subcommand per module, imported only when it runs.

Each subcommand module defines `add_arguments(parser)` and `run(args) -> int`. Importing lazily
keeps `pdserve generate` (a gRPC client) from paying for torch at start-up.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Protocol, cast

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
    "plan": ("pdserve.planner.plan_cli", "size prefill/decode tiers for SLOs; write Helm values"),
}


class Subcommand(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _load(name: str) -> Subcommand:
    return cast(Subcommand, importlib.import_module(SUBCOMMANDS[name][0]))


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdserve", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text)
        if name == chosen:  # only the chosen subcommand's module is imported
            _load(name).add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    return _load(args.command).run(args)


if __name__ == "__main__":
    sys.exit(main())
