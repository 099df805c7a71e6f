"""A real cluster over mTLS on every port (the router's gRPC and HTTP doors, router -> workers):
Generate end to end gives the plaintext cluster's greedy tokens, the router's doors refuse a
client without a certificate, and the workers refuse every caller but the router."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster, ClusterTls
from pdserve.v1 import common_pb2, prefill_pb2_grpc

from ..security.certs import Authority, Issued, issue, make_ca
from .conftest import start_cluster

pytestmark = pytest.mark.integration

PROMPTS = ("The capital of France is", "Once upon a time")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


class Pki:
    def __init__(self, folder: Path) -> None:
        self.ca: Authority = make_ca(folder, "pdserve-ca")
        self.server: Issued = issue(self.ca, folder, "pdserve-server", hosts=("127.0.0.1",))
        self.router: Issued = issue(self.ca, folder, "pdserve-router")
        self.stranger: Issued = issue(self.ca, folder, "someone-else")
        self.client: Issued = issue(self.ca, folder, "pdserve-client")

    def cluster_tls(self) -> ClusterTls:
        return ClusterTls(
            ca=self.ca.cert_path,
            server_cert=self.server.cert,
            server_key=self.server.key,
            router_cert=self.router.cert,
            router_key=self.router.key,
            router_name="pdserve-router",
            clients_need_certificates=True,
        )

    def client_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            self.ca.cert_path.read_bytes(),
            self.client.key.read_bytes(),
            self.client.cert.read_bytes(),
        )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_cluster(
    model_dir: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("tls-logs")
    running = start_cluster(model_dir, logs, 1, 1, tls=pki.cluster_tls())
    yield running
    running.stop()


async def greedy_tokens(
    address: str, credentials: grpc.ChannelCredentials | None
) -> list[list[int]]:
    async with GenerationClient.connect(address, credentials) as client:
        replies = [
            await client.generate(build_request(prompt, sampling=GREEDY), timeout=120)
            for prompt in PROMPTS
        ]
    return [list(reply.token_ids) for reply in replies]


def test_generate_over_tls_and_mtls_equals_the_plaintext_run(
    tls_cluster: Cluster, cluster: Cluster, pki: Pki
) -> None:
    over_tls = asyncio.run(greedy_tokens(tls_cluster.router.address, pki.client_credentials()))
    plaintext = asyncio.run(greedy_tokens(cluster.router.address, None))
    assert over_tls == plaintext and all(len(tokens) == 12 for tokens in over_tls)
    no_cert = grpc.ssl_channel_credentials(pki.ca.cert_path.read_bytes())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(greedy_tokens(tls_cluster.router.address, no_cert))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake fails


def _curl(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    command = ["curl", "--silent", "--max-time", "20", "--output", "/dev/null", *flags]
    return subprocess.run(
        [*command, "--write-out", "%{http_code}", url], capture_output=True, text=True
    )


def test_the_http_door_demands_a_client_certificate_too(tls_cluster: Cluster, pki: Pki) -> None:
    """Before, the OpenAI door beside an mTLS gRPC port answered plaintext to anyone."""
    https = tls_cluster.http_url.replace("http://", "https://")
    trust = ("--cacert", str(pki.ca.cert_path))
    client = ("--cert", str(pki.client.cert), "--key", str(pki.client.key))
    for path in ("/metrics", "/health", "/v1/models"):
        assert _curl(tls_cluster.http_url + path).stdout == "000"  # no plaintext at all
        assert _curl(https + path, *trust).stdout == "000"  # no certificate: no handshake
        assert _curl(https + path, *trust, *client).stdout == "200"


def _load_code(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    channel = (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    )
    with channel:
        try:
            prefill_pb2_grpc.PrefillStub(channel).Load(common_pb2.LoadRequest(), timeout=10)
        except grpc.RpcError as error:
            code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
            return code
    return grpc.StatusCode.OK


def test_workers_admit_only_the_router(tls_cluster: Cluster, pki: Pki) -> None:
    ca = pki.ca.cert_path.read_bytes()
    worker = tls_cluster.prefill[0].address

    def as_client(issued: Issued) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(ca, issued.key.read_bytes(), issued.cert.read_bytes())

    assert _load_code(worker, None) is grpc.StatusCode.UNAVAILABLE  # no plaintext at all
    no_cert = grpc.ssl_channel_credentials(ca)
    assert _load_code(worker, no_cert) is grpc.StatusCode.UNAVAILABLE  # handshake refused
    assert _load_code(worker, as_client(pki.stranger)) is grpc.StatusCode.PERMISSION_DENIED
    assert _load_code(worker, as_client(pki.router)) is grpc.StatusCode.OK


def test_generate_cli_speaks_tls_with_tls_ca(tls_cluster: Cluster, pki: Pki) -> None:
    command = [
        sys.executable,
        "-m",
        "pdserve",
        "generate",
        PROMPTS[0],
        "--address",
        tls_cluster.router.address,
        "--max-tokens",
        "12",
    ]
    trusted = [*command, "--tls-ca", str(pki.ca.cert_path)]
    client = ["--tls-cert", str(pki.client.cert), "--tls-key", str(pki.client.key)]
    printed = subprocess.run(
        [*trusted, *client], capture_output=True, text=True, timeout=120, check=True
    )
    assert printed.stdout == asyncio.run(greedy_text(tls_cluster.router.address, pki)) + "\n"
    plaintext = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stderr
    half = subprocess.run([*trusted, "--tls-cert", str(pki.stranger.cert)], capture_output=True)
    assert half.returncode == 2 and b"--tls-key" in half.stderr


async def greedy_text(address: str, pki: Pki) -> str:
    async with GenerationClient.connect(address, pki.client_credentials()) as client:
        reply = await client.generate(build_request(PROMPTS[0], sampling=GREEDY), timeout=120)
    assert len(reply.token_ids) == 12
    return str(reply.text)
