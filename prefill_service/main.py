"""`pdserve prefill`: a prefill worker (gRPC pdserve.v1.Prefill + UCX sender)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from pdserve.core.cli_config import (
    add_engine_arguments,
    add_model_arguments,
    add_server_arguments,
    add_ucx_arguments,
    engine_config_from_args,
    server_config_from_args,
    ucx_config_from_args,
)
from pdserve.core.engine_loop import EngineLoop
from pdserve.core.model_source import resolve_model
from pdserve.core.serving import ServiceHost
from pdserve.core.tier_runtime import TierRuntime, serve_tier
from pdserve.v1 import prefill_pb2, prefill_pb2_grpc

READINESS_NAME = "pdserve.v1.Prefill"
DEFAULT_PORT = 50061
DEFAULT_METRICS_PORT = 9101


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_engine_arguments(parser)
    add_server_arguments(parser, DEFAULT_PORT, DEFAULT_METRICS_PORT)
    add_ucx_arguments(parser)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s prefill %(levelname)s %(message)s")
    asyncio.run(_serve(args))
    return 0


async def _serve(args: argparse.Namespace) -> None:
    from pdserve.prefill_service.servicer import PrefillServicer

    # grpc.aio objects must be created inside the running event loop.
    host = ServiceHost(server_config_from_args(args), READINESS_NAME, _service_names())
    runtime = TierRuntime(host)
    prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(runtime), host.server)
    await serve_tier(runtime, lambda: _build_loop(args))


def _build_loop(args: argparse.Namespace) -> EngineLoop:
    from pdserve.core.transfer_ucx import KVSender
    from pdserve.prefill_service.engine import PrefillEngine
    from pdserve.prefill_service.metrics import register_engine_gauges

    engine = PrefillEngine(
        resolve_model(args.model, args.model_cache),
        engine_config_from_args(args),
        KVSender(ucx_config_from_args(args)),
    )
    register_engine_gauges(engine)
    return EngineLoop(engine)


def _service_names() -> list[str]:
    return [prefill_pb2.DESCRIPTOR.services_by_name["Prefill"].full_name]
