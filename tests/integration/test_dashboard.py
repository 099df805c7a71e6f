"""The Grafana dashboard cannot silently rot: every metric it queries is on the running tiers'
/metrics pages (router, prefill, decode of a real cluster, after one request went through)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster, Process

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "helm/pdserve/files/grafana-dashboard.json"
_METRIC = re.compile(r"\bpdserve_[a-z0-9_]+")


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    return {name for expr in exprs for name in _METRIC.findall(expr)}


def exported_metrics(process: Process) -> set[str]:
    """Sample names on the process's /metrics page (`name{labels} value` or `name value`)."""
    url = f"http://127.0.0.1:{process.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as page:
        lines = page.read().decode().splitlines()
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in lines if not line.startswith("#")}


def test_every_dashboard_metric_is_exported(cluster: Cluster) -> None:
    async def one_request() -> None:
        async with GenerationClient.connect(cluster.router.address) as client:
            await client.generate(build_request("Hello", sampling=SamplingParams(max_tokens=4)))

    asyncio.run(one_request())  # labelled counters show samples only once used
    queried = dashboard_metrics()
    assert len(queried) >= 15
    exported: set[str] = set()
    for process in cluster.processes:
        exported |= exported_metrics(process)
    assert queried <= exported, f"queried but not exported: {sorted(queried - exported)}"
