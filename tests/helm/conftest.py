"""Shared helpers for the chart tests: the contract's table, rendering, value overrides.

Ports, commands and health-service names come from docs/contract.md, parsed here: it is the one
page every part (services, chart, Dockerfile, load tests) follows, and no Python module holds
those numbers yet. Parsing the page keeps the chart tied to the contract itself, so editing one
without the other fails these tests.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "pdserve"
CONTRACT_PATH = REPO_ROOT / "docs" / "contract.md"
CONTRACT_ROLES = ("router", "prefill", "decode")

Manifest = dict[str, Any]


@dataclass(frozen=True)
class ContractRole:
    """One row of the contract's "Processes and ports" table."""

    role: str
    command: tuple[str, ...]
    grpc_port: int
    metrics_port: int
    health_service: str


def _cells(line: str) -> list[str]:
    return [cell.strip().strip("`").strip() for cell in line.strip().strip("|").split("|")]


def parse_contract_roles(text: str) -> dict[str, ContractRole]:
    """The roles table, found by its header row (so column order can change)."""
    lines = text.splitlines()
    header_index = next(i for i, line in enumerate(lines) if line.startswith("| role"))
    header = [name.lower() for name in _cells(lines[header_index])]
    column = {
        key: next(i for i, name in enumerate(header) if name.startswith(key))
        for key in ("role", "command", "grpc port", "metrics", "health")
    }
    roles: dict[str, ContractRole] = {}
    for line in lines[header_index + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        role = ContractRole(
            role=cells[column["role"]],
            command=tuple(cells[column["command"]].split()),
            grpc_port=int(cells[column["grpc port"]]),
            metrics_port=int(cells[column["metrics"]]),
            health_service=cells[column["health"]],
        )
        roles[role.role] = role
    return roles


def parse_contract_worker_flags(text: str) -> frozenset[str]:
    """Every `--flag` named in the contract's "Prefill / decode flags" section."""
    section = text.split("## Prefill / decode flags", 1)[1].split("\n## ", 1)[0]
    return frozenset(re.findall(r"`(--[a-z][a-z0-9-]*)", section))


@pytest.fixture(scope="session")
def contract_text() -> str:
    return CONTRACT_PATH.read_text()


@pytest.fixture(scope="session")
def contract_worker_flags(contract_text: str) -> frozenset[str]:
    return parse_contract_worker_flags(contract_text)


@pytest.fixture(scope="session")
def contract(contract_text: str) -> dict[str, ContractRole]:
    roles = parse_contract_roles(contract_text)
    assert set(roles) == set(CONTRACT_ROLES), f"contract roles table changed: {sorted(roles)}"
    return roles


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

# Value sets the acceptance tests render: the defaults and the overrides named in the issue.
# A test that takes an `override_values` argument runs once per set (see pytest_generate_tests).
OVERRIDES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "hpa-off-3-prefill-5-decode": {
        "prefill": {"autoscaling": {"enabled": False}, "replicas": 3},
        "decode": {"autoscaling": {"enabled": False}, "replicas": 5},
    },
    "gpus-on": {
        "prefill": {"gpu": {"enabled": True, "count": 1}, "tolerations": [GPU_TOLERATION]},
        "decode": {"gpu": {"enabled": True, "count": 2}, "tolerations": [GPU_TOLERATION]},
    },
    "servicemonitor-on": {"metrics": {"serviceMonitor": {"enabled": True}}},
    "grafana-dashboard-on-http-8080": {
        "metrics": {"grafanaDashboard": {"enabled": True}},
        "router": {"httpPort": 8080},
    },
    "custom-metrics-loadbalancer": {
        "router": {
            "service": {"type": "LoadBalancer"},
            "maxQueue": 256,
            "routingPolicy": "prefix",
        },
        "prefill": {"autoscaling": {"podsMetric": {"enabled": True}, "cpu": {"enabled": False}}},
        "decode": {
            "autoscaling": {
                "podsMetric": {
                    "enabled": True,
                    "name": "pdserve_decode_running_requests",
                    "targetAverageValue": "16",
                },
            },
            "engine": {"numKvBlocks": 4096, "numSwapBlocks": 1024, "policy": "priority"},
        },
        "ucx": {"netDevices": "eth0", "tcpPortRange": "50100-50200"},
        "model": {"volume": {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}},
    },
    "autoscaler-on": {
        "autoscaler": {"enabled": True, "profileConfigMap": "pdserve-profile", "podCpus": 0.5},
        "router": {"placement": "adaptive", "profile": "/etc/pdserve/profile.json"},
    },
    "tenants-and-kv-offload": {
        "router": {"tenants": {"tenants": {"batch": {"weight": 1, "tokens_per_second": 2000}}}},
        "engine": {"kvOffloadHostGb": 1},
        "kvOffloadDisk": {"enabled": True, "sizeGb": 8},
    },
    "tls-and-network-policy": {
        "tls": {
            "enabled": True,
            "routerSecret": "pdserve-router-tls",
            "prefillSecret": "pdserve-prefill-tls",
            "decodeSecret": "pdserve-decode-tls",
            "routerClientName": "pdserve-router",
        },
        "networkPolicy": {"enabled": True},
        "ucx": {"tcpPortRange": "50100-50200"},
        "router": {"maxPromptTokens": 4096, "maxTokens": 1024},
    },
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "override_values" in metafunc.fixturenames:
        metafunc.parametrize("override_values", list(OVERRIDES.values()), ids=list(OVERRIDES))


@functools.cache
def _render_cached(values_json: str, release: str, namespace: str) -> tuple[Manifest, ...]:
    with helm.Chart.load(CHART_DIR) as loaded:
        rendered = loaded.render(json.loads(values_json), name=release, namespace=namespace)
    objects: list[Manifest] = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".txt"):  # NOTES.txt is text for the user, not a manifest
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return tuple(objects)


def _render(values: dict[str, Any], release: str, namespace: str) -> list[Manifest]:
    """Every object the chart renders (hook Pods included), parsed; a fresh copy per call."""
    cached = _render_cached(json.dumps(values, sort_keys=True), release, namespace)
    return copy.deepcopy(list(cached))


@pytest.fixture(scope="session")
def render() -> Callable[[dict[str, Any], str, str], list[Manifest]]:
    """render(values, release, namespace): the chart rendered offline by the Helm SDK."""
    return _render
