"""A real cluster over TLS (public port) and mTLS (router -> workers): Generate end to end gives
the plaintext cluster's greedy tokens, and the workers refuse every caller but the router."""

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

    def cluster_tls(self) -> ClusterTls:
        return ClusterTls(
            ca=self.ca.cert_path,
            server_cert=self.server.cert,
            server_key=self.server.key,
            router_cert=self.router.cert,
            router_key=self.router.key,
            router_name="pdserve-router",
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
    trust = grpc.ssl_channel_credentials(pki.ca.cert_path.read_bytes())
    over_tls = asyncio.run(greedy_tokens(tls_cluster.router.address, trust))
    plaintext = asyncio.run(greedy_tokens(cluster.router.address, None))
    assert over_tls == plaintext and all(len(tokens) == 12 for tokens in over_tls)


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
    printed = subprocess.run(trusted, capture_output=True, text=True, timeout=120, check=True)
    assert printed.stdout == asyncio.run(greedy_text(tls_cluster.router.address, pki)) + "\n"
    plaintext = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stderr
    half = subprocess.run([*trusted, "--tls-cert", str(pki.stranger.cert)], capture_output=True)
    assert half.returncode == 2 and b"--tls-key" in half.stderr


async def greedy_text(address: str, pki: Pki) -> str:
    trust = grpc.ssl_channel_credentials(pki.ca.cert_path.read_bytes())
    async with GenerationClient.connect(address, trust) as client:
        reply = await client.generate(build_request(PROMPTS[0], sampling=GREEDY), timeout=120)
    assert len(reply.token_ids) == 12
    return str(reply.text)
