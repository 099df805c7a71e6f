"""`pdserve router`: the public gRPC API in front of the prefill and decode tiers.

Start-up: liveness SERVING at once; readiness (`pdserve.v1.Generation`) SERVING once the model's
tokenizer is loaded and each tier has a worker that answered `Load`. SIGTERM: readiness
NOT_SERVING, new calls refused, in-flight ones get --drain-grace-seconds, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from pdserve.core.model.source import resolve_model
from pdserve.core.serving.cli_config import (
    add_flag,
    add_model_arguments,
    add_server_arguments,
    server_config_from_args,
)
from pdserve.core.serving.server import ServerConfig, ServiceHost
from pdserve.core.serving.tls import ChannelTls
from pdserve.router.admission import Admission
from pdserve.router.config import RequestCaps, RouterConfig
from pdserve.router.dispatch import Dispatcher
from pdserve.router.http.app import HttpDoor, build_app
from pdserve.router.policy import RoutingPolicy
from pdserve.router.registry import Registry
from pdserve.router.servicer import SERVICE_NAME, RouterServicer
from pdserve.router.targets import Resolver, parse_targets, resolve_dns
from pdserve.router.validation import load_validator
from pdserve.v1 import generation_pb2_grpc

log = logging.getLogger(__name__)

ROUTER_PORT = 50051
ROUTER_METRICS_PORT = 9100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser, port=ROUTER_PORT, metrics_port=ROUTER_METRICS_PORT)
    add_model_arguments(parser)
    group = parser.add_argument_group("router")
    defaults = RouterConfig(prefill_targets="", decode_targets="")
    targets_help = "workers: host:port,... or dns:///NAME:PORT (one worker per A/AAAA record)"
    add_flag(
        group,
        "--prefill",
        str,
        "127.0.0.1:50061",
        f'prefill {targets_help}; "" for none (every prompt prefilled on decode: colocated)',
    )
    add_flag(group, "--decode", str, "127.0.0.1:50071", f"decode {targets_help}")
    add_flag(
        group,
        "--resolve-interval-seconds",
        float,
        defaults.resolve_interval_seconds,
        "how often dns:/// worker names are re-resolved",
    )
    add_flag(
        group,
        "--max-queue",
        int,
        defaults.max_queue,
        "requests in flight in the router before new ones get RESOURCE_EXHAUSTED",
    )
    add_flag(
        group,
        "--max-attempts",
        int,
        defaults.max_attempts,
        "Reserve + Prefill tries per request when a worker fails before hand-off",
    )
    add_flag(
        group,
        "--load-poll-interval-seconds",
        float,
        defaults.load_poll_interval_seconds,
        "how often every worker is asked for its Load (a failed poll marks it unhealthy)",
    )
    add_flag(
        group,
        "--abort-timeout-seconds",
        float,
        defaults.abort_timeout_seconds,
        "first Decode.Abort try's timeout after a cancel or failure (retries double it)",
    )
    add_flag(
        group,
        "--disagg-threshold",
        int,
        defaults.disagg_threshold,
        "prompts shorter than this many tokens are prefilled on their decode worker; "
        "0 = always on the prefill tier; huge = colocated (docs/disaggregation.md)",
    )
    add_flag(
        group,
        "--max-prefill-queue",
        int,
        defaults.max_prefill_queue,
        "prefill calls in flight per prefill worker at which long prompts too are prefilled "
        "on decode (with --disagg-threshold > 0); 0 = never",
    )
    add_flag(
        group,
        "--routing-policy",
        str,
        defaults.routing_policy.value,
        "least-loaded, or prefix: prefer the worker whose recent prompts share the most "
        "leading KV blocks, within a load bound (docs/router.md)",
        choices=[policy.value for policy in RoutingPolicy],
    )
    add_flag(
        group,
        "--max-migrations",
        int,
        defaults.max_migrations,
        "times a request may move to another decode worker after losing its own",
    )
    add_flag(
        group,
        "--http-port",
        int,
        defaults.http_port,
        "OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions); 0 = off",
    )
    _add_cap_arguments(parser)
    _add_worker_tls_arguments(parser)


def _add_cap_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("request caps (INVALID_ARGUMENT naming the field above)")
    caps = RequestCaps()
    add_flag(group, "--max-prompt-tokens", int, None, "prompt tokens (default: context - 1)")
    add_flag(group, "--max-tokens", int, None, "sampling.max_tokens (default: context - 1)")
    add_flag(
        group, "--max-stop-strings", int, caps.max_stop_strings, "stop strings, and stop token ids"
    )
    add_flag(
        group,
        "--max-stop-string-chars",
        int,
        caps.max_stop_string_chars,
        "one stop string's length",
    )


def _add_worker_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS to the workers (docs/security.md; plaintext without CA)")
    add_flag(group, "--worker-tls-ca", Path, None, "PEM CA bundle that signed the workers' certs")
    add_flag(group, "--worker-tls-cert", Path, None, "PEM client certificate shown to workers")
    add_flag(group, "--worker-tls-key", Path, None, "PEM private key of --worker-tls-cert")
    add_flag(
        group,
        "--worker-tls-server-name",
        str,
        None,
        "the name expected on every worker's certificate (default: the address's host)",
    )


def _worker_tls_from_args(args: argparse.Namespace) -> ChannelTls | None:
    if args.worker_tls_ca is None:
        if args.worker_tls_cert is not None or args.worker_tls_key is not None:
            raise ValueError("--worker-tls-cert / --worker-tls-key: need --worker-tls-ca")
        return None
    return ChannelTls(
        args.worker_tls_ca, args.worker_tls_cert, args.worker_tls_key, args.worker_tls_server_name
    )


def router_config_from_args(args: argparse.Namespace) -> RouterConfig:
    config = RouterConfig(
        prefill_targets=args.prefill,
        decode_targets=args.decode,
        resolve_interval_seconds=args.resolve_interval_seconds,
        max_queue=args.max_queue,
        max_attempts=args.max_attempts,
        load_poll_interval_seconds=args.load_poll_interval_seconds,
        abort_timeout_seconds=args.abort_timeout_seconds,
        disagg_threshold=args.disagg_threshold,
        max_prefill_queue=args.max_prefill_queue,
        max_migrations=args.max_migrations,
        routing_policy=RoutingPolicy(args.routing_policy),
        caps=RequestCaps(
            max_prompt_tokens=args.max_prompt_tokens,
            max_tokens=args.max_tokens,
            max_stop_strings=args.max_stop_strings,
            max_stop_string_chars=args.max_stop_string_chars,
        ),
        worker_tls=_worker_tls_from_args(args),
        max_message_bytes=args.max_message_bytes,
        http_port=args.http_port,
    )
    parse_targets("--prefill", config.prefill_targets, allow_empty=True)  # fail at start-up
    parse_targets("--decode", config.decode_targets)
    return config


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
        http = HttpDoor(app, server.host, config.http_port, server.drain_grace_seconds)
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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = router_config_from_args(args)
        server = server_config_from_args(args)
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
