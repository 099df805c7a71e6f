"""The three deployments `pdserve bench disagg` compares, each on the same two pinned cores."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pdserve.cluster import Cluster, ClusterSpec
from pdserve.planner.real_runs import own_cores

# This benchmark's ports (docs/benchmarks.md): router at BASE_PORT, workers at fixed offsets.
BASE_PORT = 50100
METRICS_BASE_PORT = 50200
UCX_ENV = (("UCX_WARN_UNUSED_ENV_VARS", "n"),)


@dataclass(frozen=True)
class Arm:
    name: str
    num_prefill: int
    num_decode: int
    conditional: bool  # routes by --disagg-threshold; else every prompt remote (or local: no tier)


ARMS = {
    "colocated": Arm("colocated", num_prefill=0, num_decode=2, conditional=False),
    "disaggregated": Arm("disaggregated", num_prefill=1, num_decode=1, conditional=False),
    "conditional": Arm("conditional", num_prefill=1, num_decode=1, conditional=True),
}


@contextlib.contextmanager
def running_arm(
    arm: Arm, model_dir: Path, threshold: int, chunk_tokens: int, log_dir: Path | None
) -> Iterator[Cluster]:
    """Starts the arm's router and pinned workers; yields the ready cluster."""
    spec = ClusterSpec(
        model_dir=model_dir,
        num_prefill=arm.num_prefill,
        num_decode=arm.num_decode,
        base_port=BASE_PORT,
        metrics_base_port=METRICS_BASE_PORT,
        worker_args=("--max-num-batched-tokens", str(chunk_tokens)),
        router_args=("--disagg-threshold", str(threshold if arm.conditional else 0)),
        env=UCX_ENV,
        pins=own_cores(arm.num_prefill, arm.num_decode),  # the same two cores in every arm
    )
    with Cluster(spec, None if log_dir is None else log_dir / arm.name) as cluster:
        cluster.wait_ready()
        yield cluster
