"""Real clusters for the integration tests: separate processes on 127.0.0.1, real UCX."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pdserve.local.cluster import Cluster, ClusterSpec, ClusterTls, CpuPin
from pdserve.local.ports import free_port_bases

# Small pools keep five processes within the CI machine's memory.
WORKER_ARGS = ("--num-kv-blocks", "256", "--num-swap-blocks", "64")
UCX_ENV = (("UCX_NET_DEVICES", "lo"), ("UCX_WARN_UNUSED_ENV_VARS", "n"))


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
    drain_grace_seconds: float = 5.0,
    num_routers: int = 1,
    pins: tuple[CpuPin, ...] = (),
) -> Cluster:
    """`env` reaches every process (e.g. a tier-only flag by its PDSERVE_ variable);
    `prefill_args` and `decode_args` follow `worker_args` on that tier's workers only; `pins`
    puts processes on CPUs of their own."""
    base_port, metrics_base_port = free_port_bases(2)
    spec = ClusterSpec(
        model_dir=model_dir,
        num_prefill=num_prefill,
        num_decode=num_decode,
        base_port=base_port,
        metrics_base_port=metrics_base_port,
        worker_args=worker_args,
        prefill_args=prefill_args,
        decode_args=decode_args,
        router_args=router_args,
        env=UCX_ENV + env,
        drain_grace_seconds=drain_grace_seconds,
        tls=tls,
        num_routers=num_routers,
        pins=pins,
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
    """2 prefill + 2 decode behind two router replicas (as the chart runs them; `router` is the
    first), shared by the tests that leave it as they found it."""
    logs = tmp_path_factory.mktemp("cluster-logs")
    running = start_cluster(model_dir, logs, 2, 2, num_routers=2)
    yield running
    running.stop()
