"""The chart lints strictly, renders valid Kubernetes objects, installs (client dry-run), and its
schema refuses bad values.

Everything runs offline through the real Helm v4 SDK (helm-python-sdk) and the bundled
Kubernetes OpenAPI schemas of kubernetes-validate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

Manifest = dict[str, Any]
Render = Callable[[dict[str, Any], str, str], list[Manifest]]

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "pdserve"
KUBE_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33")
# CRDs that kubernetes-validate does not bundle a schema for: their objects are checked
# structurally below instead (the Prometheus Operator's ServiceMonitor).
UNBUNDLED_CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
WARNING = 2  # helm lint severity: 1 info, 2 warning, 3 error


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_lint_strict_is_clean(override_values: dict[str, Any], kube_version: str) -> None:
    report = helm.lint(
        CHART_DIR, override_values, strict=True, namespace="ml", kube_version=f"v{kube_version}.0"
    )
    problems = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert report["errors"] == [] and problems == [], json.dumps(report, indent=1)
    assert report["total_charts_linted"] == 1


def _check_crd_object(obj: Manifest, objects: list[Manifest]) -> None:
    """What a ServiceMonitor must get right without its CRD schema: the port names it scrapes."""
    assert obj["spec"]["selector"]["matchLabels"], "an empty selector would scrape everything"
    selected = [
        o
        for o in objects
        if o["kind"] == "Service"
        and obj["spec"]["selector"]["matchLabels"].items() <= o["metadata"]["labels"].items()
    ]
    assert len(selected) == 3
    for service in selected:
        port_names = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in obj["spec"]["endpoints"]} <= port_names


def test_every_rendered_object_validates_strictly(
    override_values: dict[str, Any], render: Render
) -> None:
    objects = render(override_values, "demo", "ml")
    assert objects
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in UNBUNDLED_CRDS:
            # No schema ships for this CRD: kubernetes-validate must say so (not pass it), and the
            # structural check stands in for it.
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(obj, KUBE_VERSIONS[0], strict=True)
            _check_crd_object(obj, objects)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                where = ".".join(str(part) for part in error.path)
                name = f"{obj['kind']}/{obj['metadata']['name']}"
                pytest.fail(f"{name} invalid for Kubernetes {version} at {where}: {error.message}")


def test_client_dry_run_install(override_values: dict[str, Any]) -> None:
    with helm.Chart.load(CHART_DIR) as chart, helm.Config(storage_driver="memory") as config:
        release = config.install(chart, "demo", override_values, namespace="ml", dry_run="client")
    assert release["status"] == "pending-install"
    assert (release["name"], release["namespace"]) == ("demo", "ml")
    for role in ("router", "prefill", "decode"):
        assert f"name: demo-pdserve-{role}\n" in release["manifest"]
    assert "pdserve generate --address" in release["notes"]
    assert "helm test demo" in release["notes"]


BAD_VALUES = {
    "replicas as text": ("prefill:\n  replicas: three\n", "/prefill/replicas"),
    "port out of range": ("decode:\n  port: 70000\n", "/decode/port"),
    "misspelled engine key": ("engine:\n  numKVBlocks: 10\n", "numKVBlocks"),
    "gpu flag as text": ("decode:\n  gpu:\n    enabled: 'yes'\n", "/decode/gpu/enabled"),
    "unknown service type": ("router:\n  service:\n    type: Ingress\n", "/router/service/type"),
    "unknown dtype": ("prefill:\n  engine:\n    dtype: int8\n", "/prefill/engine/dtype"),
    "unknown kv cache dtype": ("engine:\n  kvCacheDtype: int4\n", "/engine/kvCacheDtype"),
    "unknown speculative method": (
        "decode:\n  engine:\n    speculative: eagle\n",
        "/decode/engine/speculative",
    ),
    "relative model path": ("model:\n  path: models/x\n", "/model/path"),
    "hpa bounds as text": ("decode:\n  autoscaling:\n    maxReplicas: '8'\n", "maxReplicas"),
    "router has no gpu": ("router:\n  gpu:\n    enabled: true\n", "gpu"),
}


@pytest.mark.parametrize("values_yaml, field", BAD_VALUES.values(), ids=list(BAD_VALUES))
def test_schema_refuses_bad_values_and_names_the_field(
    chart: helm.Chart, values_yaml: str, field: str
) -> None:
    values = helm.values_from_yaml(values_yaml)  # what `helm install -f bad.yaml` reads
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.render(values, name="demo", namespace="ml")
    assert field in str(refused.value)
    with pytest.raises(helm.HelmError):
        helm.Config(storage_driver="memory").install(chart, "demo", values, dry_run="client")


def test_defaults_pass_the_schema(chart: helm.Chart) -> None:
    chart.validate_schema(chart.merge_values({}))


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"decode": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}},
            "decode.autoscaling.minReplicas (5) must not exceed",
        ),
        (
            {"prefill": {"autoscaling": {"cpu": {"enabled": False}}}},
            "prefill.autoscaling: enable cpu or podsMetric",
        ),
        ({"autoscaler": {"enabled": True}}, "autoscaler.profileConfigMap is required"),
    ],
)
def test_inconsistent_autoscaling_fails_with_the_field_named(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=message.replace("(", r"\(").replace(")", r"\)")):
        chart.render(values, name="demo", namespace="ml")
