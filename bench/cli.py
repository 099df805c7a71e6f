"""`pdserve bench`: benchmarks, one sub-subcommand each (offline, disagg, peers, precision,
kv-int8)."""

from __future__ import annotations

import argparse
from typing import Protocol

from pdserve.bench import disagg, kv_int8, offline_cli, peers_cli, precision_quality


class Benchmark(Protocol):
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


BENCHMARKS: dict[str, Benchmark] = {
    "offline": offline_cli,
    "disagg": disagg,
    "peers": peers_cli,
    "precision": precision_quality,
    "kv-int8": kv_int8,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    benchmarks = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, module in BENCHMARKS.items():
        module.add_arguments(benchmarks.add_parser(name, help=module.HELP, description=module.HELP))


def run(args: argparse.Namespace) -> int:
    return BENCHMARKS[args.benchmark].run(args)
