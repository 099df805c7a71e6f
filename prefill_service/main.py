"""`pdserve prefill`: a prefill worker (gRPC pdserve.v1.Prefill + UCX sender)."""

from __future__ import annotations

import argparse

import grpc

from pdserve.core.model.source import resolve_model
from pdserve.core.serving.cli_config import engine_config_from_args, ucx_config_from_args
from pdserve.core.serving.engine_loop import EngineLoop
from pdserve.core.serving.tier_runtime import TierRuntime, add_tier_arguments, run_tier

SERVICE_NAME = "pdserve.v1.Prefill"  # also the readiness name
DEFAULT_PORT = 50061
DEFAULT_METRICS_PORT = 9101


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tier_arguments(parser, DEFAULT_PORT, DEFAULT_METRICS_PORT)


def run(args: argparse.Namespace) -> int:
    return run_tier(args, SERVICE_NAME, _add_servicer, lambda: _build_loop(args))


def _add_servicer(runtime: TierRuntime, server: grpc.aio.Server) -> None:
    from pdserve.prefill_service.servicer import PrefillServicer
    from pdserve.v1 import prefill_pb2_grpc

    prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(runtime), server)


def _build_loop(args: argparse.Namespace) -> EngineLoop:
    from pdserve.core.transfer.ucx_sender import KVSender
    from pdserve.prefill_service.engine import PrefillEngine
    from pdserve.prefill_service.metrics import register_engine_gauges

    engine = PrefillEngine(
        resolve_model(args.model, args.model_cache),
        engine_config_from_args(args),
        KVSender(ucx_config_from_args(args)),
    )
    register_engine_gauges(engine)
    return EngineLoop(engine)
