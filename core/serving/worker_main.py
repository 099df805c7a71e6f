"""One `run()` for both worker tiers: flags checked before serving, the model loaded on a thread
once the server answers, the SLO step budget fitted to the engine, then served until SIGTERM.

Each tier says only what differs (`WorkerTier`): its service, its servicers, how it builds its
engine loop (its engine class, transfer endpoints, gauges).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from pdserve.core.config import EngineConfig
from pdserve.core.serving.cli_config import engine_config_from_args
from pdserve.core.serving.engine_loop import EngineLoop
from pdserve.core.serving.step_metrics import register_step_gauges
from pdserve.core.serving.structured_metrics import register_structured_metrics
from pdserve.core.serving.tier_runtime import TierRuntime, run_tier
from pdserve.costmodel.profile import load_profile
from pdserve.costmodel.step_budget import ItlMode, StepCosts, WorkerStepBudget


@dataclass(frozen=True)
class WorkerTier:
    command: str  # `pdserve <command>`, as error messages name it
    service_name: str  # also the readiness name
    add_servicers: Callable[[TierRuntime, grpc.aio.Server], None]
    build_loop: Callable[[argparse.Namespace], EngineLoop]  # loads the model


def run_worker(args: argparse.Namespace, tier: WorkerTier) -> int:
    try:  # a bad --itl-slo or --profile stops the worker before it serves
        step_costs = worker_step_costs(args, engine_config_from_args(args))
    except ValueError as error:
        print(f"pdserve {tier.command}: {error}", file=sys.stderr)
        return 2

    def build_loop() -> EngineLoop:
        loop = tier.build_loop(args)
        register_step_gauges(tier.command, loop.steps, step_costs)
        register_structured_metrics(tier.command, loop.engine.grammars)
        if step_costs is not None and step_costs.itl_slo_s is not None:
            # Corrected by its measured steps, its streams' lengths forecast as they finish.
            lengths = loop.engine.output_lengths
            budget = WorkerStepBudget(step_costs, recorder=loop.steps, lengths=lengths)
            loop.engine.scheduler.step_budget = budget
        return loop

    return run_tier(args, tier.service_name, tier.add_servicers, build_loop)


def worker_step_costs(args: argparse.Namespace, config: EngineConfig) -> StepCosts | None:
    """A worker's cost model from `--profile` (its step gauges compare it with the measured
    steps; with `--itl-slo` it also budgets each step); None without a profile."""
    if args.profile is None:
        if args.itl_slo is not None:
            raise ValueError("--itl-slo: needs --profile (the cost model that prices a step)")
        return None
    return StepCosts(
        load_profile(args.profile),
        config.max_num_batched_tokens,
        args.itl_slo,
        ItlMode(args.itl_slo_mode),
    )
