"""`pdserve prefill`: a prefill worker (gRPC pdserve.v1.Prefill, and Decode for lent streams)."""

from __future__ import annotations

import argparse

import grpc

from pdserve.core.model.source import resolve_model
from pdserve.core.serving.cli_config import engine_config_from_args, ucx_config_from_args
from pdserve.core.serving.engine_loop import EngineLoop
from pdserve.core.serving.tier_runtime import TierRuntime, add_tier_arguments
from pdserve.core.serving.worker_main import WorkerTier, run_worker

SERVICE_NAME = "pdserve.v1.Prefill"  # also the readiness name
DEFAULT_PORT = 50061
DEFAULT_METRICS_PORT = 9101


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tier_arguments(parser, DEFAULT_PORT, DEFAULT_METRICS_PORT)


def run(args: argparse.Namespace) -> int:
    return run_worker(args, WorkerTier("prefill", SERVICE_NAME, _add_servicers, _build_loop))


def _add_servicers(runtime: TierRuntime, server: grpc.aio.Server) -> None:
    """pdserve.v1.Prefill, and the engine-agnostic half of pdserve.v1.Decode for the streams the
    router may lend this worker when the prefill tier idles (role-flexible workers,
    docs/router.md)."""
    from pdserve.core.serving.stream_servicer import StreamServicer
    from pdserve.prefill_service.servicer import PrefillServicer
    from pdserve.v1 import decode_pb2_grpc, prefill_pb2_grpc

    prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(runtime), server)
    decode_pb2_grpc.add_DecodeServicer_to_server(StreamServicer(runtime), server)


def _build_loop(args: argparse.Namespace) -> EngineLoop:
    from pdserve.core.transfer.ucx_sender import KVSender
    from pdserve.prefill_service.engine import PrefillEngine
    from pdserve.prefill_service.metrics import register_engine_gauges

    config = engine_config_from_args(args)
    engine = PrefillEngine(
        resolve_model(args.model, args.model_cache), config, KVSender(ucx_config_from_args(args))
    )
    register_engine_gauges(engine)
    return EngineLoop(engine)
