"""`pdserve decode`: a decode worker (gRPC pdserve.v1.Decode + UCX receiver)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from pdserve.core.cli_config import (
    add_engine_arguments,
    add_flag,
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
from pdserve.decode_service.engine import DecodeEngine, DecodeLimits
from pdserve.v1 import decode_pb2, decode_pb2_grpc

READINESS_NAME = "pdserve.v1.Decode"
DEFAULT_PORT = 50071
DEFAULT_METRICS_PORT = 9102


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_engine_arguments(parser)
    add_server_arguments(parser, DEFAULT_PORT, DEFAULT_METRICS_PORT)
    add_ucx_arguments(parser)
    add_flag(parser, "--max-pending-reservations", int, 256, "reservations waiting for blocks")
    add_flag(parser, "--kv-timeout-seconds", float, 60.0, "how long KV may take to arrive")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s decode %(levelname)s %(message)s")
    asyncio.run(_serve(args))
    return 0


async def _serve(args: argparse.Namespace) -> None:
    from pdserve.decode_service.servicer import DecodeServicer

    # grpc.aio objects must be created inside the running event loop.
    host = ServiceHost(server_config_from_args(args), READINESS_NAME, _service_names())
    runtime = TierRuntime(host)
    decode_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(runtime), host.server)
    await serve_tier(runtime, lambda: _build_loop(args))


def _build_loop(args: argparse.Namespace) -> EngineLoop:
    from pdserve.core.transfer_ucx import KVReceiver
    from pdserve.decode_service.metrics import register_engine_gauges

    limits = DecodeLimits(
        max_pending_reservations=args.max_pending_reservations,
        kv_timeout_s=args.kv_timeout_seconds,
    )
    engine = DecodeEngine(
        resolve_model(args.model, args.model_cache),
        engine_config_from_args(args),
        lambda cache: KVReceiver(cache, ucx_config_from_args(args)),
        limits,
    )
    register_engine_gauges(engine)
    return EngineLoop(engine, background=engine)


def _service_names() -> list[str]:
    return [decode_pb2.DESCRIPTOR.services_by_name["Decode"].full_name]
