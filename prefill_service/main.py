"""`pdserve prefill`: a prefill worker (gRPC pdserve.v1.Prefill, and Decode for lent streams)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import grpc

from pdserve.core.model.source import resolve_model
from pdserve.core.serving.cli_config import engine_config_from_args, ucx_config_from_args
from pdserve.core.serving.engine_loop import EngineLoop
from pdserve.core.serving.tier_runtime import TierRuntime, add_tier_arguments, run_tier

if TYPE_CHECKING:
    from pdserve.costmodel.step_budget import StepCosts

SERVICE_NAME = "pdserve.v1.Prefill"  # also the readiness name
DEFAULT_PORT = 50061
DEFAULT_METRICS_PORT = 9101


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tier_arguments(parser, DEFAULT_PORT, DEFAULT_METRICS_PORT)


def run(args: argparse.Namespace) -> int:
    from pdserve.costmodel.step_budget import worker_step_costs

    try:  # a bad --itl-slo or --profile stops the worker before it serves
        step_costs = worker_step_costs(args, engine_config_from_args(args))
    except ValueError as error:
        print(f"pdserve prefill: {error}", file=sys.stderr)
        return 2
    return run_tier(args, SERVICE_NAME, _add_servicer, lambda: _build_loop(args, step_costs))


def _add_servicer(runtime: TierRuntime, server: grpc.aio.Server) -> None:
    """pdserve.v1.Prefill, and pdserve.v1.Decode for the streams the router may lend this worker
    when the prefill tier idles (role-flexible workers, docs/router.md)."""
    from pdserve.decode_service.servicer import DecodeServicer
    from pdserve.prefill_service.servicer import PrefillServicer
    from pdserve.v1 import decode_pb2_grpc, prefill_pb2_grpc

    prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(runtime), server)
    decode_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(runtime), server)


def _build_loop(args: argparse.Namespace, step_costs: StepCosts | None) -> EngineLoop:
    from pdserve.core.transfer.ucx_sender import KVSender
    from pdserve.costmodel.step_budget import WorkerStepBudget
    from pdserve.prefill_service.engine import PrefillEngine
    from pdserve.prefill_service.metrics import register_engine_gauges

    config = engine_config_from_args(args)
    engine = PrefillEngine(
        resolve_model(args.model, args.model_cache), config, KVSender(ucx_config_from_args(args))
    )
    engine.scheduler.step_budget = None if step_costs is None else WorkerStepBudget(step_costs)
    register_engine_gauges(engine)
    return EngineLoop(engine)
