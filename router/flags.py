"""`pdserve router`'s flags (each also read from env `PDSERVE_<FLAG>`) and the configs built from
them once at start-up; main.py runs the process with those configs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.serving.cli_config import (
    add_flag,
    add_model_arguments,
    add_server_arguments,
    keepalive_from_args,
)
from pdserve.core.serving.tls import ChannelTls
from pdserve.costmodel.profile import load_profile
from pdserve.costmodel.step_budget import StepCosts
from pdserve.router.config import RelayMode, RequestCaps, RouterConfig
from pdserve.router.placement.prefill_place import PlacementMode
from pdserve.router.placement.worker_choice import RoutingPolicy
from pdserve.router.targets import parse_targets
from pdserve.router.tenants import TenantConfig, load_tenants

ROUTER_PORT = 50051
ROUTER_METRICS_PORT = 9100


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    """Server and model flags (shared with the workers), then the router's own."""
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
        "--tenants",
        Path,
        None,
        "YAML file of tenants: weights (shares of --max-queue), rate limits, API keys "
        "(docs/admission.md)",
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
        "--engine-stall-seconds",
        float,
        defaults.engine_stall_seconds,
        "a decode worker whose Load reports one engine step running this long is wedged: its "
        "streams fail over to other workers, as a lost worker's do (0: never)",
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
        "--placement",
        str,
        defaults.placement_mode.value,
        "where prompts are prefilled: threshold (--disagg-threshold, --max-prefill-queue) or "
        "adaptive (the cost model from --profile predicts each option; docs/router.md)",
        choices=[mode.value for mode in PlacementMode],
    )
    _add_cost_model_arguments(group)
    add_flag(
        group,
        "--routing-policy",
        str,
        defaults.routing_policy.value,
        "least-loaded; prefix: prefer the worker whose recent prompts share the most leading "
        "KV blocks, within a load bound; prefix-hash: the worker the prompt's leading blocks hash "
        "to, within a load bound, the same in every router replica (docs/router.md)",
        choices=[policy.value for policy in RoutingPolicy],
    )
    add_flag(
        group,
        "--prefix-hash-blocks",
        int,
        defaults.prefix_hash_blocks,
        "--routing-policy prefix-hash: how many leading full KV blocks of a prompt key its worker",
    )
    add_flag(
        group,
        "--relay",
        str,
        defaults.relay.value,
        "multiplexed: one Decode.Multiplex stream per decode worker, one message per engine step "
        "for all its requests; per-request: one Generate stream per request (docs/router.md)",
        choices=[mode.value for mode in RelayMode],
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
    add_flag(
        group,
        "--http-request-timeout-seconds",
        float,
        defaults.http_request_timeout_seconds,
        "an HTTP request's deadline (OpenAI's API sends none); 0 = none",
    )
    _add_cap_arguments(parser)
    _add_worker_tls_arguments(parser)


def _add_cost_model_arguments(group: argparse._ArgumentGroup) -> None:
    add_flag(group, "--profile", Path, None, "`pdserve profile`'s cost model (adaptive placement)")
    add_flag(
        group,
        "--itl-slo",
        float,
        None,
        "seconds: the workers' ITL SLO (as they were started with), which caps their steps' "
        "prompt tokens; adaptive placement predicts with it (default: off)",
    )
    add_flag(
        group,
        "--max-num-batched-tokens",
        int,
        EngineConfig().max_num_batched_tokens,
        "the workers' token budget a step (as they were started with): adaptive placement "
        "predicts their prompt chunks with it",
    )
    add_flag(
        group,
        "--slo-ttft",
        float,
        None,
        "seconds: a request predicted to wait longer for its first token is refused at once "
        "(RESOURCE_EXHAUSTED, a retry delay; a request's own `slo` overrides it; needs "
        "--profile; default: off)",
    )
    add_flag(
        group,
        "--slo-tpot",
        float,
        None,
        "seconds: likewise for the mean time per output token (default: off)",
    )


def _costs_from_args(args: argparse.Namespace) -> StepCosts | None:
    if args.profile is None:
        if args.itl_slo is not None:
            raise ValueError("--itl-slo: needs --profile (the cost model that prices a step)")
        return None
    return StepCosts(load_profile(args.profile), args.max_num_batched_tokens, args.itl_slo)


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
        engine_stall_seconds=args.engine_stall_seconds,
        abort_timeout_seconds=args.abort_timeout_seconds,
        disagg_threshold=args.disagg_threshold,
        max_prefill_queue=args.max_prefill_queue,
        placement_mode=PlacementMode(args.placement),
        costs=_costs_from_args(args),
        max_migrations=args.max_migrations,
        routing_policy=RoutingPolicy(args.routing_policy),
        relay=RelayMode(args.relay),
        prefix_hash_blocks=args.prefix_hash_blocks,
        caps=RequestCaps(
            max_prompt_tokens=args.max_prompt_tokens,
            max_tokens=args.max_tokens,
            max_stop_strings=args.max_stop_strings,
            max_stop_string_chars=args.max_stop_string_chars,
        ),
        worker_tls=_worker_tls_from_args(args),
        max_message_bytes=args.max_message_bytes,
        keepalive=keepalive_from_args(args),
        http_port=args.http_port,
        http_request_timeout_seconds=args.http_request_timeout_seconds,
        slo_ttft_seconds=args.slo_ttft,
        slo_tpot_seconds=args.slo_tpot,
        tenants=TenantConfig() if args.tenants is None else load_tenants(args.tenants),
    )
    parse_targets("--prefill", config.prefill_targets, allow_empty=True)  # fail at start-up
    parse_targets("--decode", config.decode_targets)
    return config
