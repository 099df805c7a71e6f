"""The chart's security options (docs/security.md): certificates from Secrets, TLS flags, probes
on the plaintext health port, and NetworkPolicies that let only the router reach the workers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .conftest import OVERRIDES

Manifest = dict[str, Any]
Render = Callable[[dict[str, Any], str, str], list[Manifest]]
SECURED = OVERRIDES["tls-and-network-policy"]
MOUNT = "/etc/pdserve/tls"


def deployments(objects: list[Manifest]) -> dict[str, Manifest]:
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in objects
        if o["kind"] == "Deployment"
    }


def container(deployment: Manifest) -> Manifest:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(only)


def test_defaults_are_plaintext_without_policies(render: Render) -> None:
    objects = render({}, "demo", "ml")
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    for deployment in deployments(objects).values():
        assert not [a for a in container(deployment)["args"] if a.startswith("--tls")]


def test_each_role_mounts_its_secret_and_serves_tls(render: Render) -> None:
    for role, deployment in deployments(render(SECURED, "demo", "ml")).items():
        pod = deployment["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert volume["secret"]["secretName"] == f"pdserve-{role}-tls"
        main = container(deployment)
        (mount,) = [m for m in main["volumeMounts"] if m["name"] == "tls"]
        assert mount == {"name": "tls", "mountPath": MOUNT, "readOnly": True}
        args = main["args"]
        assert f"--tls-cert={MOUNT}/tls.crt" in args and f"--tls-key={MOUNT}/tls.key" in args
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert main[probe]["grpc"]["port"] == 8086  # the plaintext health port
        assert "--health-port=8086" in args
        if role == "router":
            assert f"--worker-tls-ca={MOUNT}/ca.crt" in args
            assert "--worker-tls-server-name=demo-pdserve-worker" in args
            assert "--max-prompt-tokens=4096" in args and "--max-tokens=1024" in args
        else:
            assert f"--tls-client-ca={MOUNT}/ca.crt" in args
            assert "--tls-allowed-clients=pdserve-router" in args


def test_workers_take_grpc_only_from_the_router_and_ucx_only_from_each_other(
    render: Render,
) -> None:
    policies = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in render(SECURED, "demo", "ml")
        if o["kind"] == "NetworkPolicy"
    }
    assert set(policies) == {"prefill", "decode"}
    ports = {"prefill": 50061, "decode": 50071}
    for role, peer in (("prefill", "decode"), ("decode", "prefill")):
        spec = policies[role]["spec"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == role
        grpc_rule, ucx_rule, metrics_rule, health_rule = spec["ingress"]
        (source,) = grpc_rule["from"]
        assert source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
        assert grpc_rule["ports"] == [{"port": ports[role], "protocol": "TCP"}]
        (source,) = ucx_rule["from"]
        assert source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == peer
        assert ucx_rule["ports"] == [{"port": 50100, "endPort": 50200, "protocol": "TCP"}]
        (scraper,) = metrics_rule["from"]
        assert scraper["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "monitoring"
        }
        assert "from" not in health_rule and health_rule["ports"][0]["port"] == 8086
