"""Real clusters for the integration tests: separate processes on 127.0.0.1, real UCX."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdserve.cluster import Cluster, ClusterSpec, ClusterTls

# Small pools keep five processes within the CI machine's memory.
WORKER_ARGS = ("--num-kv-blocks", "256", "--num-swap-blocks", "64")
UCX_ENV = (("UCX_NET_DEVICES", "lo"), ("UCX_WARN_UNUSED_ENV_VARS", "n"))


def free_port_base(span: int = 30) -> int:
    """A base port whose whole span [base, base + span) is free right now."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + span < 65000 and all(_is_free(base + offset) for offset in range(span)):
            return base
    raise RuntimeError("no free port range")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def start_cluster(
    model_dir: Path,
    log_dir: Path,
    num_prefill: int,
    num_decode: int,
    router_args: tuple[str, ...] = (),
    worker_args: tuple[str, ...] = WORKER_ARGS,
    env: tuple[tuple[str, str], ...] = (),
    tls: ClusterTls | None = None,
    prefill_args: tuple[str, ...] = (),
    decode_args: tuple[str, ...] = (),
) -> Cluster:
    """`env` reaches every process (e.g. a tier-only flag by its PDSERVE_ variable);
    `prefill_args` and `decode_args` follow `worker_args` on that tier's workers only."""
    spec = ClusterSpec(
        model_dir=model_dir,
        num_prefill=num_prefill,
        num_decode=num_decode,
        base_port=free_port_base(),
        metrics_base_port=free_port_base(),
        worker_args=worker_args,
        prefill_args=prefill_args,
        decode_args=decode_args,
        router_args=router_args,
        env=UCX_ENV + env,
        drain_grace_seconds=5.0,
        tls=tls,
    )
    cluster = Cluster(spec, log_dir)
    cluster.start()
    try:
        cluster.wait_ready()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="package")
def cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Router + 2 prefill + 2 decode, shared by the tests that leave it as they found it."""
    running = start_cluster(model_dir, tmp_path_factory.mktemp("cluster-logs"), 2, 2)
    yield running
    running.stop()
