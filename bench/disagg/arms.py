"""The four deployments `pdserve bench disagg` compares, each on the same two pinned cores."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pdserve.local.cluster import Cluster, ClusterSpec
from pdserve.local.ports import free_port_bases
from pdserve.planner.real_runs import own_cores

UCX_ENV = (("UCX_WARN_UNUSED_ENV_VARS", "n"),)


class Routing(enum.Enum):
    """How an arm's router places prompts."""

    REMOTE = "remote"  # every prompt on the prefill tier (local when there is none)
    THRESHOLD = "threshold"  # shorter than --threshold on decode (conditional)
    ADAPTIVE = "adaptive"  # the cost model (--placement adaptive) with SLO-aware steps


@dataclass(frozen=True)
class Arm:
    name: str
    num_prefill: int
    num_decode: int
    routing: Routing


ARMS = {
    "colocated": Arm("colocated", num_prefill=0, num_decode=2, routing=Routing.REMOTE),
    "disaggregated": Arm("disaggregated", num_prefill=1, num_decode=1, routing=Routing.REMOTE),
    "conditional": Arm("conditional", num_prefill=1, num_decode=1, routing=Routing.THRESHOLD),
    "adaptive": Arm("adaptive", num_prefill=1, num_decode=1, routing=Routing.ADAPTIVE),
}


@dataclass(frozen=True)
class ArmSettings:
    """What the arms share: the conditional arm's threshold, every worker's token budget a
    step, and the adaptive arm's cost model and ITL SLO (None: its steps have no budget)."""

    threshold: int
    chunk_tokens: int
    profile: Path | None  # the adaptive arm's
    itl_slo_s: float | None
    itl_slo_mode: str = "mean"  # what the ITL SLO bounds (costmodel/step_budget.py ItlMode)


def worker_and_router_flags(
    arm: Arm, settings: ArmSettings
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(worker flags, router flags) of the arm."""
    chunk = ("--max-num-batched-tokens", str(settings.chunk_tokens))
    if arm.routing is not Routing.ADAPTIVE:
        threshold = settings.threshold if arm.routing is Routing.THRESHOLD else 0
        return chunk, ("--disagg-threshold", str(threshold))
    if settings.profile is None:
        raise ValueError("the adaptive arm needs a profile")
    cost_model: tuple[str, ...] = ("--profile", str(settings.profile))
    if settings.itl_slo_s is not None:
        cost_model += ("--itl-slo", str(settings.itl_slo_s))
    worker_cost_model = (*cost_model, "--itl-slo-mode", settings.itl_slo_mode)
    return (*chunk, *worker_cost_model), ("--placement", "adaptive", *chunk, *cost_model)


@contextlib.contextmanager
def running_arm(
    arm: Arm,
    model_dir: Path,
    settings: ArmSettings,
    log_dir: Path | None,
    extra_router_args: tuple[str, ...] = (),
    extra_worker_args: tuple[str, ...] = (),
) -> Iterator[Cluster]:
    """Starts the arm's router and pinned workers (each with the extra flags after its own);
    yields the ready cluster."""
    worker_args, router_args = worker_and_router_flags(arm, settings)
    router_args = (*router_args, *extra_router_args)
    worker_args = (*worker_args, *extra_worker_args)
    base_port, metrics_base_port = free_port_bases(2)
    spec = ClusterSpec(
        model_dir=model_dir,
        num_prefill=arm.num_prefill,
        num_decode=arm.num_decode,
        base_port=base_port,
        metrics_base_port=metrics_base_port,
        worker_args=worker_args,
        router_args=router_args,
        env=UCX_ENV,
        pins=own_cores(arm.num_prefill, arm.num_decode),  # the same two cores in every arm
    )
    with Cluster(spec, None if log_dir is None else log_dir / arm.name) as cluster:
        cluster.wait_ready()
        yield cluster
