"""`pdserve bench NAME`: every benchmark's one door.

Each module defines `add_arguments(parser)` and `run(args) -> int`, and only the chosen one is
imported (pdserve/commands.py: `--help` loads no benchmark, hence no torch). The families are
packages: offline/ (the engine core's throughput), disagg/ (colocated vs disaggregated serving),
admission/ (what the router admits under overload), autoscale/ (the autoscaler against fixed
deployments), migration/ (moving streams between decode
workers), offload/ (KV offload tiers), pods/ (CPU-limited pods), peers/ (side by side with
llama.cpp), router/ (the router's relay capacity), sjf/ (scheduling policies), micro/ (one
mechanism each).
"""

from __future__ import annotations

import argparse
import signal
import sys

from pdserve.commands import CommandGroup

BENCHMARKS: dict[str, tuple[str, str]] = {
    "offline": ("pdserve.bench.offline.cli", "offline throughput of the engine core"),
    "make-workloads": (
        "pdserve.bench.offline.make_workloads",
        "write the shipped offline workloads (seeded)",
    ),
    "disagg": (
        "pdserve.bench.disagg.cli",
        "colocated vs disaggregated vs conditional serving on the same cores (Poisson load)",
    ),
    "disagg-ttft": (
        "pdserve.bench.disagg.ttft",
        "KV transfer's exposed share of TTFT, whole-prompt vs layer-wise push",
    ),
    "admission": (
        "pdserve.bench.admission.cli",
        "the router's admission modes (off, --max-queue, predicted SLO miss) on the same overload",
    ),
    "autoscale": (
        "pdserve.bench.autoscale.cli",
        "pdserve autoscale vs every fixed deployment of CPU-limited pods on a shifting load",
    ),
    "make-autoscale-trace": (
        "pdserve.bench.autoscale.trace",
        "write the shipped shifting-load trace of `bench autoscale` (its phases' lengths scaled)",
    ),
    "migration": (
        "pdserve.bench.migration.cli",
        "moving a stream off a decode worker: live KV migration vs re-prefill; drain time",
    ),
    "spec": (
        "pdserve.bench.offline.spec",
        "speculative decoding (n-gram drafts) vs none: tokens/s, batch-1 ms/token, acceptance",
    ),
    "make-spec-workload": (
        "pdserve.bench.offline.spec_workload",
        "write the shipped repetition-rich workload of `bench spec` (chat prompts)",
    ),
    "structured": (
        "pdserve.bench.offline.structured",
        "the same requests free and under JSON schemas: tokens/s, batch-1 ms/token, validity",
    ),
    "make-structured-workload": (
        "pdserve.bench.offline.structured_workload",
        "write the shipped workload of `bench structured` (chat prompts, one schema each)",
    ),
    "grammar-libraries": (
        "pdserve.bench.micro.grammar_libraries",
        "xgrammar vs llguidance vs outlines-core (where installed): compile and mask times",
    ),
    "offload": (
        "pdserve.bench.offload.cli",
        "KV offload tiers (none, host, host+disk) on multi-turn traffic through pdserve up",
    ),
    "make-multiturn-workload": (
        "pdserve.bench.offload.workload",
        "write the shipped multi-turn workload of `bench offload` (interleaved conversations)",
    ),
    "peers": ("pdserve.bench.peers.cli", "pdserve side by side with llama.cpp"),
    "router": ("pdserve.bench.router.cli", "the router's overhead and relay over fake tiers"),
    "router-footprint": (
        "pdserve.bench.router.footprint",
        "router start-up time and resident memory (fake tiers)",
    ),
    "sjf-latency": ("pdserve.bench.sjf.latency", "sjf vs fcfs, wall-clock latency"),
    "sjf-steps": ("pdserve.bench.sjf.steps", "sjf vs fcfs, latency in engine steps"),
    "attention": ("pdserve.bench.micro.attention", "paged attention kernels, Triton vs torch"),
    "transfer": ("pdserve.bench.micro.transfer", "KV transfer over UCX vs gRPC, vs ucx_perftest"),
    "prefix-cache": ("pdserve.bench.micro.prefix_cache", "prefix cache off vs on, shared prompt"),
    "kv-int8": ("pdserve.bench.micro.kv_int8", "int8 KV cache: quality, capacity, speed"),
    "sliding-window": (
        "pdserve.bench.micro.sliding_window",
        "sliding window vs full attention: KV bytes per transfer, blocks per sequence",
    ),
    "precision": (
        "pdserve.bench.micro.precision",
        "opt-in weight precisions: quality and batch-1 speed",
    ),
    "pod-cpus": (
        "pdserve.bench.pods.cpu_limit",
        "decode pods under CPU limits (--pod-cpus): one 0.5 pod vs one 1.0 vs two 0.5",
    ),
    "detokenizer": (
        "pdserve.bench.micro.detokenizer",
        "the engine's per-token text cost at output lengths 100-4,000: stream vs whole decode",
    ),
    "linear": (
        "pdserve.bench.micro.linear_kernels",
        "the model's matmuls on each CPU path: panel kernel vs oneDNN, int8 kernel vs torch's",
    ),
    "gemm-backend": (
        "pdserve.bench.micro.gemm_backend",
        "CPU matmuls on the panel kernel vs oneDNN vs F.linear (engine A/B, fresh processes)",
    ),
}


GROUP = CommandGroup("benchmark", BENCHMARKS)


def run(args: argparse.Namespace) -> int:
    # A `timeout` or `kill` (SIGTERM) unwinds like Ctrl-C: the clusters, servers and peers a
    # benchmark started are stopped by its `finally` blocks, not left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return GROUP.load(args.benchmark).run(args)
