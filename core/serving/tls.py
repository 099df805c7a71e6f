"""TLS for every pdserve port, and mutual TLS between the router and the tiers (docs/security.md).

A server with `ServerTls` serves TLS only; with a client CA it also demands a client certificate
signed by that CA (mTLS), and with allowed names it admits only certificates that carry one of
them (a DNS/URI subject alternative name or the common name): the worker tiers use this so that
only the router may call them. The router's channels to the workers use `ChannelTls`. Files are
PEM and read once at start-up; without TLS settings everything stays plaintext (`pdserve up` on
127.0.0.1).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import grpc

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
PeerCheck = Callable[[Context], Awaitable[None]]
# Where grpc's auth context keeps a verified client certificate's names.
_SAN_KEY = "x509_subject_alternative_name"
_COMMON_NAME_KEY = "x509_common_name"


@dataclass(frozen=True)
class ServerTls:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: mTLS, a client certificate signed by it is required
    allowed_clients: tuple[str, ...] = ()  # set: one of these names must be on the client cert

    def __post_init__(self) -> None:
        if self.allowed_clients and self.client_ca is None:
            raise ValueError("--tls-allowed-clients: needs --tls-client-ca (mTLS) to check names")


@dataclass(frozen=True)
class ChannelTls:
    ca: Path  # verifies the server's certificate
    cert: Path | None = None  # with key: the client certificate presented (mTLS)
    key: Path | None = None
    server_name: str | None = None  # the name expected on server certs instead of the address

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("--worker-tls-cert and --worker-tls-key: set both or neither")


def server_tls(
    cert: Path | None, key: Path | None, client_ca: Path | None, allowed_clients: str
) -> ServerTls | None:
    """From the flags: None (plaintext) when no certificate is given."""
    names = tuple(name.strip() for name in allowed_clients.split(",") if name.strip())
    if cert is None and key is None:
        if client_ca is not None or names:
            raise ValueError(
                "--tls-client-ca / --tls-allowed-clients: need --tls-cert and --tls-key"
            )
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key: set both or neither")
    return ServerTls(cert, key, client_ca, names)


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    ca = tls.client_ca.read_bytes() if tls.client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(tls.key.read_bytes(), tls.cert.read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


def secure_channel(
    address: str, tls: ChannelTls | None, options: list[tuple[str, Any]]
) -> grpc.aio.Channel:
    """A grpc.aio channel to `address`: TLS (and mTLS) when `tls` is set, else plaintext."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes(),
        private_key=tls.key.read_bytes() if tls.key is not None else None,
        certificate_chain=tls.cert.read_bytes() if tls.cert is not None else None,
    )
    if tls.server_name is not None:
        options = [*options, ("grpc.ssl_target_name_override", tls.server_name)]
    return grpc.aio.secure_channel(address, credentials, options=options)


def peer_names(context: Context) -> set[str]:
    """The names on the verified client certificate (empty without one): its subject alternative
    names, or its common name only when it has none (RFC 6125 6.4.4: a certificate that carries
    SANs is identified by them alone, so a CN cannot smuggle in a second identity)."""
    auth = context.auth_context()
    sans = {value.decode() for value in auth.get(_SAN_KEY, [])}
    if sans:
        return sans
    return {value.decode() for value in auth.get(_COMMON_NAME_KEY, [])}


def allowed_peers(names: tuple[str, ...]) -> PeerCheck:
    """A check that refuses (PERMISSION_DENIED) a caller whose certificate has none of `names`."""
    allowed = frozenset(names)

    async def check(context: Context) -> None:
        presented = peer_names(context)
        if not presented & allowed:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"peer: client certificate names {sorted(presented)} are not among "
                f"--tls-allowed-clients",
            )

    return check
