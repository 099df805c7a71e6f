"""Where a tier's workers are: a fixed `host:port` list, or a DNS name re-resolved over time.

`dns:///NAME:PORT` is what a Kubernetes headless Service gives: one A/AAAA record per ready pod.
Every record becomes one worker, addressed directly, so the router (not kube-proxy) picks the
worker and can balance by load.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

DNS_SCHEME = "dns:///"

# Resolves (host, port) to worker addresses "ip:port"; tests inject their own.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


@dataclass(frozen=True)
class StaticTargets:
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class DnsTargets:
    host: str
    port: int


Targets = StaticTargets | DnsTargets


def parse_targets(flag: str, spec: str, allow_empty: bool = False) -> Targets:
    """`host:port,...` or `dns:///NAME:PORT` (or "" when `allow_empty`: no workers); a
    ValueError names `flag` when it is neither."""
    spec = spec.strip()
    if allow_empty and not spec:
        return StaticTargets(addresses=())
    if spec.startswith(DNS_SCHEME):
        host, port = _split_host_port(flag, spec.removeprefix(DNS_SCHEME))
        return DnsTargets(host=host, port=port)
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"{flag}: expected host:port,... or dns:///NAME:PORT, got {spec!r}")
    addresses = tuple(format_address(*_split_host_port(flag, part)) for part in parts)
    return StaticTargets(addresses=tuple(dict.fromkeys(addresses)))


def _split_host_port(flag: str, text: str) -> tuple[str, int]:
    host, separator, port_text = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{flag}: expected host:port with a port in 1..65535, got {text!r}")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    """`host:port`, with IPv6 literals in brackets as gRPC targets want them."""
    try:
        is_v6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        is_v6 = False
    return f"[{host}]:{port}" if is_v6 else f"{host}:{port}"


async def resolve_dns(host: str, port: int) -> list[str]:
    """Every A and AAAA record of `host`, as worker addresses (sorted, without repeats)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({format_address(str(info[4][0]), port) for info in infos})
