"""`pdserve decode`: a decode worker (gRPC pdserve.v1.Decode + UCX receiver)."""

from __future__ import annotations

import argparse

import grpc

from pdserve.core.model.source import resolve_model
from pdserve.core.serving.cli_config import add_flag, engine_config_from_args, ucx_config_from_args
from pdserve.core.serving.engine_loop import EngineLoop
from pdserve.core.serving.tier_runtime import TierRuntime, add_tier_arguments
from pdserve.core.serving.worker_main import WorkerTier, run_worker

SERVICE_NAME = "pdserve.v1.Decode"  # also the readiness name
DEFAULT_PORT = 50071
DEFAULT_METRICS_PORT = 9102
# Layer-wise push in 5 groups cut the transfer time exposed on TTFT on shared memory and on TCP
# alike, and cost nothing measurable on short prompts (docs/transfer.md).
DEFAULT_KV_LAYER_GROUPS = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tier_arguments(parser, DEFAULT_PORT, DEFAULT_METRICS_PORT)
    add_flag(parser, "--max-pending-reservations", int, 256, "reservations waiting for blocks")
    add_flag(parser, "--kv-timeout-seconds", float, 60.0, "how long KV may take to arrive")
    add_flag(
        parser,
        "--kv-layer-groups",
        int,
        DEFAULT_KV_LAYER_GROUPS,
        "pieces each prompt's KV travels in, one per group of layers, each pushed by prefill as "
        "soon as its layers are computed (1 = the whole prompt in one message; capped at the "
        "model's layer count; docs/transfer.md)",
    )


def run(args: argparse.Namespace) -> int:
    return run_worker(args, WorkerTier("decode", SERVICE_NAME, _add_servicers, _build_loop))


def _add_servicers(runtime: TierRuntime, server: grpc.aio.Server) -> None:
    from pdserve.decode_service.servicer import DecodeServicer
    from pdserve.v1 import decode_pb2_grpc

    decode_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(runtime), server)


def _build_loop(args: argparse.Namespace) -> EngineLoop:
    from pdserve.core.transfer.ucx import KVReceiver
    from pdserve.core.transfer.ucx_sender import KVSender
    from pdserve.decode_service.engine import DecodeEngine, DecodeLimits
    from pdserve.decode_service.metrics import register_engine_gauges

    limits = DecodeLimits(
        max_pending_reservations=args.max_pending_reservations,
        kv_timeout_s=args.kv_timeout_seconds,
    )
    config = engine_config_from_args(args)
    engine = DecodeEngine(
        resolve_model(args.model, args.model_cache),
        config,
        lambda cache: KVReceiver(
            cache,
            ucx_config_from_args(args),
            min(args.kv_layer_groups, cache.layout.num_layers),  # < 1 is refused, naming it
        ),
        limits,
        sender_factory=lambda: KVSender(ucx_config_from_args(args)),  # drains move KV out
    )
    register_engine_gauges(engine)
    return EngineLoop(engine, background=engine)
