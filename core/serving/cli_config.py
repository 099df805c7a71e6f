"""Flags shared by the service entry points, each also read from env `PDSERVE_<FLAG>`.

This is the one place that reads pdserve's environment: everything below receives frozen configs.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from pdserve.core.config import (
    KV_CACHE_DTYPES,
    MODEL_DTYPES,
    QUANTIZATIONS,
    SPECULATIVE_METHODS,
    EngineConfig,
    SchedulingPolicy,
)
from pdserve.core.serving.keepalive import Keepalive
from pdserve.core.serving.server import DEFAULT_MAX_MESSAGE_BYTES, ServerConfig
from pdserve.core.serving.tls import server_tls

if TYPE_CHECKING:
    from pdserve.core.transfer.ucx_runtime import UcxConfig

ENV_PREFIX = "PDSERVE_"
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def env_name(flag: str) -> str:
    """`--num-kv-blocks` -> `PDSERVE_NUM_KV_BLOCKS`."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def add_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    kind: Callable[[str], object],
    default: object,
    help_text: str,
    choices: list[str] | None = None,
) -> None:
    """A flag whose default comes from its env variable when set (flag > env > default)."""
    raw = os.environ.get(env_name(flag))
    value = kind(raw) if raw is not None else default
    parser.add_argument(
        flag, type=kind, default=value, choices=choices, help=f"{help_text} (env {env_name(flag)})"
    )


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    defaults = EngineConfig()
    for field in fields(EngineConfig):
        flag = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        if field.name == "policy":
            choices = [policy.value for policy in SchedulingPolicy]
            add_flag(group, flag, str, default.value, "scheduling policy", choices=choices)
        elif field.name == "dtype":
            add_flag(
                group,
                flag,
                str,
                default,
                "model dtype (the KV cache's too, unless --kv-cache-dtype int8)",
                choices=sorted(MODEL_DTYPES),
            )
        elif field.name == "kv_cache_dtype":
            help_text = "KV cache element type (auto: the model dtype)"
            add_flag(group, flag, str, default, help_text, list(KV_CACHE_DTYPES))
        elif field.name == "quantization":
            add_flag(group, flag, str, default, "weight-only quantization", list(QUANTIZATIONS))
        elif field.name == "device":
            add_flag(group, flag, str, default, "torch device (cpu, cuda, cuda:1)")
        elif field.name == "speculative":
            help_text = "speculative decoding: how drafts are proposed (docs/speculative.md)"
            add_flag(group, flag, str, default, help_text, list(SPECULATIVE_METHODS))
        elif field.name == "enable_prefix_caching":
            _add_no_prefix_cache(group)
        elif field.name in OFFLOAD_HELP:
            add_flag(group, flag, type(default), default, OFFLOAD_HELP[field.name])
        else:
            add_flag(group, flag, int, default, field.name.replace("_", " "))


OFFLOAD_HELP = {
    "kv_offload_host_gb": "host memory (GB) keeping prefix blocks the KV pool evicts (0: none; "
    "docs/kv_offload.md)",
    "kv_offload_disk_path": "this worker's own folder for prefix blocks the host tier evicts "
    "(reused after a restart; '': no disk tier)",
    "kv_offload_disk_gb": "most GB of blocks in --kv-offload-disk-path",
}


def _add_no_prefix_cache(group: argparse._ArgumentGroup) -> None:
    """`--no-prefix-cache` (env `PDSERVE_NO_PREFIX_CACHE=true`) turns the prefix cache off."""
    raw = os.environ.get(env_name("--no-prefix-cache"))
    group.add_argument(
        "--no-prefix-cache",
        dest="enable_prefix_caching",
        action="store_false",
        default=not parse_bool(raw) if raw is not None else True,
        help=f"do not reuse cached prefix blocks (env {env_name('--no-prefix-cache')})",
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    values = {field.name: getattr(args, field.name) for field in fields(EngineConfig)}
    values["policy"] = SchedulingPolicy(values["policy"])
    return EngineConfig(**values)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "--model", str, None, "local HF model folder (default: the embedded SmolLM2)")
    add_flag(parser, "--model-cache", Path, None, "where the default model is prepared")


def add_server_arguments(parser: argparse.ArgumentParser, port: int, metrics_port: int) -> None:
    group = parser.add_argument_group("server")
    add_flag(group, "--host", str, "0.0.0.0", "address to bind")
    add_flag(group, "--port", int, port, "gRPC port")
    add_flag(group, "--metrics-port", int, metrics_port, "Prometheus /metrics HTTP port")
    add_flag(group, "--drain-grace-seconds", float, 30.0, "time in-flight work gets on SIGTERM")
    add_flag(
        group,
        "--max-message-bytes",
        int,
        DEFAULT_MAX_MESSAGE_BYTES,
        "largest gRPC message received or sent (bigger ones end RESOURCE_EXHAUSTED)",
    )
    add_flag(
        group,
        "--log-level",
        str,
        "info",
        "log level (debug adds a line per decision: the router's placements)",
        choices=list(LOG_LEVELS),
    )
    add_keepalive_arguments(group)
    add_tls_server_arguments(parser)


def configure_logging(level: str, line_format: str) -> None:
    """The process's log level (--log-level) and line format."""
    logging.basicConfig(level=LOG_LEVELS[level], format=line_format)


def add_keepalive_arguments(group: argparse._ArgumentGroup) -> None:
    """HTTP/2 keepalive of this process's server and of its channels (the router's to the
    workers): core/serving/keepalive.py."""
    defaults = Keepalive()
    add_flag(
        group,
        "--keepalive-seconds",
        float,
        defaults.time_seconds,
        "HTTP/2 ping to a peer silent this long (every server and channel)",
    )
    add_flag(
        group,
        "--keepalive-timeout-seconds",
        float,
        defaults.timeout_seconds,
        "no ping answer this long: the peer is lost, its streams fail (and migrate)",
    )


def keepalive_from_args(args: argparse.Namespace) -> Keepalive:
    return Keepalive(args.keepalive_seconds, args.keepalive_timeout_seconds)


def add_tls_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (docs/security.md; plaintext when no --tls-cert)")
    add_flag(group, "--tls-cert", Path, None, "PEM certificate (chain) this server presents")
    add_flag(group, "--tls-key", Path, None, "PEM private key of --tls-cert")
    add_flag(
        group, "--tls-client-ca", Path, None, "PEM CA bundle: require client certs it signed (mTLS)"
    )
    add_flag(
        group,
        "--tls-allowed-clients",
        str,
        "",
        "comma-separated names (SAN DNS/URI or CN) one of which a client cert must carry",
    )
    add_flag(group, "--health-port", int, None, "plaintext port serving only gRPC health (probes)")


def parse_bool(text: str) -> bool:
    """Flag/env booleans: 1/true/yes/on and 0/false/no/off (any case)."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_ucx_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("UCX (transports come from UCX's own UCX_TLS etc.)")
    add_flag(
        group,
        "--ucx-endpoint-error-handling",
        parse_bool,
        False,
        "detect dead peers (true across pods; forces TCP, as shared memory cannot support it)",
    )
    add_flag(group, "--ucx-send-timeout-seconds", float, 30.0, "how long a KV send may wait")
    add_flag(
        group,
        "--ucx-tcp-syn-retries",
        int,
        2,
        "SYNs resent before a KV connect fails (UCX's TCP_SYN_CNT: 2 gives up on a vanished pod "
        "after 7 s; the kernel's default waits 127 s while no other transfer moves)",
    )
    add_flag(
        group,
        "--kv-staging-limit-mb",
        size_limit_mb,
        KV_STAGING_LIMIT_BYTES,
        "buffers (each a copy of a prompt's KV) a decode worker holds at once for transfers on "
        "their way in; a transfer past it waits for earlier ones to land, its sender within its "
        "send timeout (0: no limit)",
    )
    add_flag(
        group,
        "--kv-staging",
        str,
        "host",
        "where KV transfer buffers live: host, or device (the KV cache's own: GPU tiers hand KV "
        "over without a host round trip, through UCX's CUDA transports)",
        choices=["host", "device"],
    )


def ucx_config_from_args(args: argparse.Namespace) -> UcxConfig:
    from pdserve.core.transfer.staging import StagingPlace
    from pdserve.core.transfer.ucx_runtime import UcxConfig  # imports ucxx: only in the tiers

    return UcxConfig(
        endpoint_error_handling=args.ucx_endpoint_error_handling,
        send_timeout_s=args.ucx_send_timeout_seconds,
        tcp_syn_retries=args.ucx_tcp_syn_retries,
        staging=StagingPlace(args.kv_staging),
        staging_limit_bytes=args.kv_staging_limit_mb,
    )


# A worker's default: 44 prompts of 500 tokens of the default model on their way in at once.
KV_STAGING_LIMIT_BYTES = 1024 * 2**20


def size_limit_mb(text: str) -> int | None:
    """A size flag in MiB, as bytes; 0 means no limit (None)."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (MiB; 0: no limit), got {text}")
    return round(value * 2**20) or None


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        drain_grace_seconds=args.drain_grace_seconds,
        max_message_bytes=args.max_message_bytes,
        tls=server_tls(args.tls_cert, args.tls_key, args.tls_client_ca, args.tls_allowed_clients),
        health_port=args.health_port,
        keepalive=keepalive_from_args(args),
    )
