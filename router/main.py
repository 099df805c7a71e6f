"""`pdserve router`: the public gRPC API in front of the prefill and decode tiers.

Start-up: liveness SERVING at once; readiness (`pdserve.v1.Generation`) SERVING once the model's
tokenizer is loaded and each tier has a worker that answered `Load`. SIGTERM: readiness
NOT_SERVING, new calls refused, in-flight ones get --drain-grace-seconds, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from pdserve.core.model.source import resolve_model
from pdserve.core.serving.cli_config import configure_logging, server_config_from_args
from pdserve.core.serving.server import ServerConfig, ServiceHost
from pdserve.router.admission import Admission
from pdserve.router.config import RouterConfig
from pdserve.router.dispatch import Dispatcher
from pdserve.router.flags import add_router_arguments, router_config_from_args
from pdserve.router.http.app import HttpDoor, build_app, check_http_door
from pdserve.router.registry import Registry
from pdserve.router.servicer import SERVICE_NAME, RouterServicer
from pdserve.router.targets import Resolver, resolve_dns
from pdserve.router.validation import load_validator
from pdserve.v1 import generation_pb2_grpc

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommand's flags (`pdserve.cli` calls this, then `run`): all in flags.py."""
    add_router_arguments(parser)


@dataclass(frozen=True)
class ModelSource:
    model: str | None
    cache_dir: Path | None


@dataclass(frozen=True)
class Router:
    """The parts of one router process, wired together."""

    config: RouterConfig
    host: ServiceHost
    registry: Registry
    dispatcher: Dispatcher
    admission: Admission
    http: HttpDoor | None  # None with --http-port 0


def build_router(
    config: RouterConfig, server: ServerConfig, resolver: Resolver = resolve_dns
) -> Router:
    host = ServiceHost(server, SERVICE_NAME, [SERVICE_NAME])
    registry = Registry(config, resolver)
    dispatcher = Dispatcher(registry, config)
    admission = Admission(dispatcher, config)
    generation_pb2_grpc.add_GenerationServicer_to_server(RouterServicer(admission), host.server)
    http = None
    if config.http_port != 0:

        def ready() -> bool:
            return admission.validator is not None and registry.ready() and not host.draining

        app = build_app(admission, ready)
        http = HttpDoor(app, server.host, config.http_port, server.drain_grace_seconds, server.tls)
    return Router(config, host, registry, dispatcher, admission, http)


async def serve(router: Router, source: ModelSource) -> None:
    """Serves until SIGTERM/SIGINT (or `router.host.request_stop()`), then drains."""
    await router.host.start()
    if router.http is not None:
        router.http.start()
    start_up = asyncio.create_task(_become_ready(router, source))
    try:
        await router.host.serve_until_signal()
    finally:
        start_up.cancel()
        if router.http is not None:
            await router.http.stop()
        await router.dispatcher.wait_aborts()
        await router.registry.close()
    if start_up.done() and not start_up.cancelled():
        error = start_up.exception()
        if error is not None:
            raise error


async def _become_ready(router: Router, source: ModelSource) -> None:
    try:
        await router.registry.start()
        model_dir = await asyncio.to_thread(resolve_model, source.model, source.cache_dir)
        router.admission.validator = await asyncio.to_thread(
            load_validator, model_dir, router.config.caps
        )
        # What is loaded now (modules, the tokenizer) lives as long as the process: out of the
        # collector's sight, a full collection under load scans only the requests' objects.
        gc.freeze()
        while not router.registry.ready():
            await asyncio.sleep(router.config.load_poll_interval_seconds)
    except Exception:
        log.exception("router: start-up failed")
        router.host.request_stop()
        raise
    if not router.host.draining:
        await router.host.set_ready(True)
        log.info("router ready: tokenizer loaded, workers in both tiers answer")


async def _build_and_serve(config: RouterConfig, server: ServerConfig, source: ModelSource) -> None:
    # Built inside the running loop: grpc.aio and the health servicer bind to it.
    await serve(build_router(config, server), source)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = router_config_from_args(args)
        server = server_config_from_args(args)
        check_http_door(config.http_port, server.tls)
    except ValueError as error:
        print(f"pdserve router: {error}", file=sys.stderr)
        return 2
    source = ModelSource(args.model, args.model_cache)
    try:
        asyncio.run(_build_and_serve(config, server, source))
    except Exception as error:
        print(f"pdserve router: {error}", file=sys.stderr)
        return 1
    return 0
