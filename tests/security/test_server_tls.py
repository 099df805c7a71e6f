"""ServiceHost (every pdserve server) over real sockets: TLS with the right CA works, a wrong CA
fails the handshake, mTLS refuses a client without a certificate or with a name not allowed, the
plaintext health port serves probes; undecodable bytes end INVALID_ARGUMENT, logged once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from pdserve.core.serving.server import ServerConfig, ServiceHost
from pdserve.core.serving.tls import ServerTls
from pdserve.local.ports import free_port
from pdserve.v1 import (
    decode_pb2,
    decode_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    prefill_pb2,
    prefill_pb2_grpc,
)

from .certs import Authority, Issued, issue, make_ca

SERVICE = "pdserve.test.Service"
HOST = "127.0.0.1"


class Pki:
    def __init__(self, folder: Path) -> None:
        self.ca: Authority = make_ca(folder, "pdserve-test-ca")
        self.server: Issued = issue(self.ca, folder, "worker", hosts=(HOST, "localhost"))
        self.router: Issued = issue(self.ca, folder, "router")
        self.stranger: Issued = issue(self.ca, folder, "stranger")
        # The allowed name in its CN only, beside a SAN of another name: not the router.
        self.impostor: Issued = issue(self.ca, folder, "impostor", common_name="router")
        # No SANs at all: then, and only then, the CN names the client.
        self.cn_only_router: Issued = issue(self.ca, folder / "cn-only", "router", alt_names=False)
        self.other_ca: Authority = make_ca(folder / "other", "other-ca")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@contextlib.asynccontextmanager
async def serving(tls: ServerTls | None, health_port: int | None = None) -> AsyncIterator[str]:
    config = ServerConfig(HOST, free_port(), free_port(), 1.0, tls=tls, health_port=health_port)
    host = ServiceHost(config, SERVICE, [SERVICE])
    await host.start()
    try:
        yield f"{HOST}:{config.port}"
    finally:
        await host.server.stop(None)
        if host.health_server is not None:
            await host.health_server.stop(None)


def credentials(ca: Authority, client: Issued | None = None) -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(ca.cert_path.read_bytes())
    return grpc.ssl_channel_credentials(
        ca.cert_path.read_bytes(), client.key.read_bytes(), client.cert.read_bytes()
    )


async def check(address: str, creds: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    channel = (
        grpc.aio.insecure_channel(address)
        if creds is None
        else grpc.aio.secure_channel(address, creds)
    )
    async with channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def test_tls_works_with_the_right_ca_and_fails_with_a_wrong_one(pki: Pki) -> None:
    async def body() -> None:
        async with serving(ServerTls(pki.server.cert, pki.server.key)) as address:
            assert await check(address, credentials(pki.ca)) is grpc.StatusCode.OK
            assert await check(address, credentials(pki.other_ca)) is grpc.StatusCode.UNAVAILABLE
            assert await check(address, None) is grpc.StatusCode.UNAVAILABLE  # no plaintext

    asyncio.run(body())


def test_mtls_refuses_a_client_without_a_certificate(pki: Pki) -> None:
    tls = ServerTls(pki.server.cert, pki.server.key, client_ca=pki.ca.cert_path)

    async def body() -> None:
        async with serving(tls) as address:
            assert await check(address, credentials(pki.ca)) is grpc.StatusCode.UNAVAILABLE
            assert await check(address, credentials(pki.ca, pki.router)) is grpc.StatusCode.OK

    asyncio.run(body())


def test_mtls_admits_only_the_allowed_names(pki: Pki) -> None:
    tls = ServerTls(pki.server.cert, pki.server.key, pki.ca.cert_path, ("router",))

    async def body() -> None:
        async with serving(tls) as address:
            assert await check(address, credentials(pki.ca, pki.router)) is grpc.StatusCode.OK
            denied = await check(address, credentials(pki.ca, pki.stranger))
            assert denied is grpc.StatusCode.PERMISSION_DENIED

    asyncio.run(body())


def test_a_common_name_counts_only_on_a_certificate_without_alternative_names(pki: Pki) -> None:
    tls = ServerTls(pki.server.cert, pki.server.key, pki.ca.cert_path, ("router",))

    async def body() -> None:
        async with serving(tls) as address:
            impostor = await check(address, credentials(pki.ca, pki.impostor))
            assert impostor is grpc.StatusCode.PERMISSION_DENIED
            cn_only = await check(address, credentials(pki.ca, pki.cn_only_router))
            assert cn_only is grpc.StatusCode.OK

    asyncio.run(body())


async def _reflection_code(address: str, creds: grpc.ChannelCredentials) -> grpc.StatusCode:
    """Lists the services over reflection (a stream-request method), as ghz and grpcurl do."""
    async with grpc.aio.secure_channel(address, creds) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        try:
            async for _ in stub.ServerReflectionInfo(iter([request]), timeout=5):
                pass
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def test_reflection_admits_only_the_allowed_names(pki: Pki) -> None:
    tls = ServerTls(pki.server.cert, pki.server.key, pki.ca.cert_path, ("router",))

    async def body() -> None:
        async with serving(tls) as address:
            admitted = await _reflection_code(address, credentials(pki.ca, pki.router))
            assert admitted is grpc.StatusCode.OK
            denied = await _reflection_code(address, credentials(pki.ca, pki.stranger))
            assert denied is grpc.StatusCode.PERMISSION_DENIED

    asyncio.run(body())


def test_health_port_answers_probes_in_plaintext_beside_mtls(pki: Pki) -> None:
    tls = ServerTls(pki.server.cert, pki.server.key, pki.ca.cert_path, ("router",))
    health_port = free_port()

    async def body() -> None:
        async with serving(tls, health_port):
            assert await check(f"{HOST}:{health_port}", None) is grpc.StatusCode.OK

    asyncio.run(body())


def test_undecodable_bytes_are_invalid_argument_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> list[grpc.StatusCode]:
        async with serving(None) as address, grpc.aio.insecure_channel(address) as channel:
            # No serializers: raw bytes both ways.
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/grpc.health.v1.Health/Check"
            )
            codes = []
            for _ in range(30):
                try:
                    await call(b"\xff\xff\xff\xff", timeout=5)
                except grpc.aio.AioRpcError as error:
                    codes.append(error.code())
                    assert (error.details() or "").startswith("request: ")
            return codes

    with caplog.at_level(logging.WARNING):
        codes = asyncio.run(body())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 30
    lines = [r for r in caplog.records if "undecodable request" in r.getMessage()]
    assert len(lines) == 1 and "Traceback" not in caplog.text


def test_every_pdserve_method_refuses_undecodable_bytes() -> None:
    """The generated add_*_to_server registrations (router, prefill, decode services) all pass
    through the guard: garbage never reaches a servicer, whatever the method."""
    services = {
        generation_pb2.DESCRIPTOR.services_by_name["Generation"]: (
            generation_pb2_grpc.add_GenerationServicer_to_server,
            generation_pb2_grpc.GenerationServicer(),
        ),
        prefill_pb2.DESCRIPTOR.services_by_name["Prefill"]: (
            prefill_pb2_grpc.add_PrefillServicer_to_server,
            prefill_pb2_grpc.PrefillServicer(),
        ),
        decode_pb2.DESCRIPTOR.services_by_name["Decode"]: (
            decode_pb2_grpc.add_DecodeServicer_to_server,
            decode_pb2_grpc.DecodeServicer(),
        ),
    }

    async def body() -> dict[str, grpc.StatusCode]:
        config = ServerConfig(HOST, free_port(), free_port(), 1.0)
        host = ServiceHost(config, SERVICE, [SERVICE])
        for add, servicer in services.values():
            add(servicer, host.server)
        await host.start()
        codes = {}
        try:
            async with grpc.aio.insecure_channel(f"{HOST}:{config.port}") as channel:
                for service in services:
                    for method in service.methods:
                        path = f"/{service.full_name}/{method.name}"
                        multi = (
                            channel.unary_stream
                            if method.server_streaming
                            else (channel.unary_unary)
                        )
                        call = multi(path)(b"\xff\xff\xff\xff", timeout=5)
                        codes[path] = await call.code()
        finally:
            await host.server.stop(None)
        return codes

    codes = asyncio.run(body())
    assert len(codes) == sum(len(service.methods) for service in services)
    assert set(codes.values()) == {grpc.StatusCode.INVALID_ARGUMENT}, codes
