"""`pdserve plan` writes a values file that the chart lints, renders and validates with, and
whose replicas, HPAs and placement (the router's flags) are the plan's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from pdserve.cli import build_parser, main
from pdserve.costmodel.profile import BlockCosts, CostModel, Profile
from pdserve.router.main import router_config_from_args
from pdserve.router.placement.prefill_place import PlacementConfig

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

Manifest = dict[str, Any]
Render = Callable[[dict[str, Any], str, str], list[Manifest]]
CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "pdserve"
WARNING = 2


def _profile(path: Path, fixed_s: float, per_prefill_token_s: float) -> Path:
    blocks = BlockCosts(
        block_nbytes=1, swap_s=0.0, gather_s=0.0, scatter_s=0.001, wire_bytes_per_s=1e9
    )
    model = CostModel((fixed_s, per_prefill_token_s, 0.0, 0.001, 0.0))
    Profile(model, blocks, block_size=16).save(path)
    return path


def _plan(tmp_path: Path, per_prefill_token_s: float) -> dict[str, Any]:
    profile = _profile(tmp_path / "profile.json", 0.02, per_prefill_token_s)
    workload = tmp_path / "mixed.json"
    workload.write_text(
        json.dumps(
            {
                "rate": 1,
                "duration_s": 60,
                "prompt_tokens": {"min": 10, "max": 100},
                "output_tokens": {"min": 20, "max": 200},
            }
        )
    )
    out = tmp_path / "values.yaml"
    argv = [
        "plan",
        "--profile",
        str(profile),
        "--workload",
        str(workload),
        "--rate",
        "4",
        "--slo-ttft-p90",
        "0.5",
        "--slo-itl-p99",
        "0.1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    values: dict[str, Any] = yaml.safe_load(out.read_text())
    return values


# Cheap prompts: one colocated tier can do it. Dear prompts: they must leave the decode workers.
@pytest.mark.parametrize("per_prefill_token_s", [0.0001, 0.002])
def test_plan_values_lint_render_and_validate(
    tmp_path: Path, render: Render, per_prefill_token_s: float
) -> None:
    values = _plan(tmp_path, per_prefill_token_s)
    report = helm.lint(CHART_DIR, values, strict=True, namespace="ml", kube_version="v1.33.0")
    assert report["errors"] == [], json.dumps(report, indent=1)
    assert [m for m in report["messages"] if m["severity"] >= WARNING] == []
    objects = render(values, "demo", "ml")
    for obj in objects:
        if obj["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(obj, "1.33", strict=True)
    hpas = {
        o["metadata"]["name"].rsplit("-", 1)[-1]: o
        for o in objects
        if o["kind"] == "HorizontalPodAutoscaler"
    }
    for tier in ("prefill", "decode"):
        planned = values[tier]
        if planned["replicas"] == 0:
            assert tier not in hpas  # colocated: no prefill tier to scale
            continue
        spec = hpas[tier]["spec"]
        assert spec["minReplicas"] == planned["replicas"] <= spec["maxReplicas"]
        metric = planned["autoscaling"]["podsMetric"]
        assert spec["metrics"] == [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": metric["name"]},
                    "target": {
                        "type": "AverageValue",
                        "averageValue": metric["targetAverageValue"],
                    },
                },
            }
        ]


def test_plan_values_hand_the_simulated_placement_to_the_router(
    tmp_path: Path, render: Render
) -> None:
    """The router's args, parsed by `pdserve router` itself, place as the plan simulated: its
    threshold and the router's own default prefill queue bound (the simulator's too)."""
    values = _plan(tmp_path, 0.002)
    assert values["router"]["maxPrefillQueue"] == PlacementConfig().max_prefill_queue
    deployments = [o for o in render(values, "demo", "ml") if o["kind"] == "Deployment"]
    (router,) = [o for o in deployments if o["metadata"]["name"].endswith("-router")]
    argv = router["spec"]["template"]["spec"]["containers"][0]["args"]
    config = router_config_from_args(build_parser(argv).parse_args(argv))
    threshold = values["router"]["disaggThreshold"]
    assert config.placement == PlacementConfig(threshold, PlacementConfig().max_prefill_queue)
