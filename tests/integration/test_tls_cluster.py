"""A real cluster over TLS (public port) and mTLS (router -> workers): Generate end to end gives
the plaintext cluster's greedy tokens, and the workers refuse every caller but the router."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.cluster import Cluster, ClusterTls
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
