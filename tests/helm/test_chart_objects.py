"""What the chart renders: separate tiers, contract ports and probes, DNS wiring, scaling."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

Manifest = dict[str, Any]
Render = Callable[[dict[str, Any], str, str], list[Manifest]]

RELEASE = "demo"
NAMESPACE = "ml"
ROLES = ("router", "prefill", "decode")
WORKERS = ("prefill", "decode")
ROUTER_HTTP_PORT = 8000  # docs/contract.md: the router's --http-port
DASHBOARD = Path(__file__).resolve().parents[2] / "helm/pdserve/files/grafana-dashboard.json"


def name_of(role: str) -> str:
    return f"{RELEASE}-pdserve-{role}"


def one(objects: list[Manifest], kind: str, name: str) -> Manifest:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} named {name}, found {len(found)}"
    return found[0]


def kinds(objects: list[Manifest], kind: str) -> dict[str, Manifest]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container(objects: list[Manifest], role: str) -> Manifest:
    pod_spec = one(objects, "Deployment", name_of(role))["spec"]["template"]["spec"]
    assert [c["name"] for c in pod_spec["containers"]] == [role]
    found: Manifest = pod_spec["containers"][0]
    return found


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name=value` or `--name value`, or None."""
    for index, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and index + 1 < len(args):
            return args[index + 1]
    return None


@pytest.fixture()
def defaults(render: Render) -> list[Manifest]:
    return render({}, RELEASE, NAMESPACE)


def test_prefill_and_decode_are_separate_deployments_hpas_and_pdbs(
    defaults: list[Manifest],
) -> None:
    assert set(kinds(defaults, "Deployment")) == {name_of(role) for role in ROLES}
    hpas = kinds(defaults, "HorizontalPodAutoscaler")
    assert set(hpas) == {name_of("prefill"), name_of("decode")}  # router HPA is opt-in
    for role in WORKERS:
        assert hpas[name_of(role)]["apiVersion"] == "autoscaling/v2"
        assert hpas[name_of(role)]["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name_of(role),
        }
        # The HPA owns the replica count: the Deployment must not fight it on every upgrade.
        assert "replicas" not in one(defaults, "Deployment", name_of(role))["spec"]
    pdbs = kinds(defaults, "PodDisruptionBudget")
    for role in ROLES:
        selector = pdbs[name_of(role)]["spec"]["selector"]["matchLabels"]
        template = one(defaults, "Deployment", name_of(role))["spec"]["template"]
        assert selector.items() <= template["metadata"]["labels"].items()
        assert selector["app.kubernetes.io/component"] == role  # one tier's pods, not all


def test_tier_selectors_do_not_overlap(defaults: list[Manifest]) -> None:
    for role in ROLES:
        service_selector = one(defaults, "Service", name_of(role))["spec"]["selector"]
        for other in ROLES:
            labels = one(defaults, "Deployment", name_of(other))["spec"]["template"]["metadata"]
            matches = service_selector.items() <= labels["labels"].items()
            assert matches == (other == role), f"Service {role} selects {other} pods: {matches}"


def test_ports_and_probes_follow_the_contract(
    defaults: list[Manifest], contract: dict[str, Any]
) -> None:
    for role in ROLES:
        row = contract[role]
        main = container(defaults, role)
        assert main["args"][0] == row.command[-1]  # `pdserve <role>`: the image's entrypoint
        assert flag(main["args"], "--port") == str(row.grpc_port)
        assert flag(main["args"], "--metrics-port") == str(row.metrics_port)
        ports = {p["name"]: p["containerPort"] for p in main["ports"]}
        expected = {"grpc": row.grpc_port, "metrics": row.metrics_port}
        if role == "router":  # and its OpenAI HTTP API
            expected["http"] = ROUTER_HTTP_PORT
            assert flag(main["args"], "--http-port") == str(ROUTER_HTTP_PORT)
        assert ports == expected
        for probe, service in (
            ("startupProbe", row.health_service),
            ("readinessProbe", row.health_service),
            ("livenessProbe", ""),
        ):
            assert main[probe]["grpc"] == {"port": row.grpc_port, "service": service}, probe
        startup = main["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # model loading
        svc_ports = {p["name"]: p for p in one(defaults, "Service", name_of(role))["spec"]["ports"]}
        assert {name: p["port"] for name, p in svc_ports.items()} == expected
        assert {p["targetPort"] for p in svc_ports.values()} == set(expected)
        annotations = one(defaults, "Deployment", name_of(role))["spec"]["template"]["metadata"]
        assert annotations["annotations"]["prometheus.io/port"] == str(row.metrics_port)


def test_router_reaches_workers_through_headless_service_dns(
    defaults: list[Manifest], contract: dict[str, Any]
) -> None:
    args = container(defaults, "router")["args"]
    for role in WORKERS:
        service = one(defaults, "Service", name_of(role))
        assert service["spec"]["clusterIP"] == "None"  # headless: one A record per ready pod
        assert service["spec"].get("publishNotReadyAddresses", False) is False
        fqdn = f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
        assert flag(args, f"--{role}") == f"dns:///{fqdn}:{contract[role].grpc_port}"
    assert one(defaults, "Service", name_of("router"))["spec"]["type"] == "ClusterIP"
    assert flag(args, "--resolve-interval-seconds") == "5"


def test_router_replicas_sit_behind_a_headless_service_and_share_a_routing_policy(
    render: Render, contract: dict[str, Any]
) -> None:
    """Clients reach every replica through dns:/// + round_robin on the headless Service; it
    carries gRPC only (the ServiceMonitor scrapes each pod once, through the other Service)."""
    router = {"replicas": 3, "routingPolicy": "prefix-hash", "prefixHashBlocks": 8}
    objects = render({"router": router}, RELEASE, NAMESPACE)
    assert one(objects, "Deployment", name_of("router"))["spec"]["replicas"] == 3
    headless = one(objects, "Service", f"{name_of('router')}-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert (
        headless["spec"]["selector"]
        == one(objects, "Service", name_of("router"))["spec"]["selector"]
    )
    ports = {p["name"]: p["port"] for p in headless["spec"]["ports"]}
    assert ports == {"grpc": contract["router"].grpc_port}
    args = container(objects, "router")["args"]
    assert flag(args, "--routing-policy") == "prefix-hash"
    assert flag(args, "--prefix-hash-blocks") == "8"
    off = render({"router": {"headlessService": {"enabled": False}}}, RELEASE, NAMESPACE)
    assert f"{name_of('router')}-headless" not in kinds(off, "Service")


def test_router_pods_run_the_torch_free_router_image(render: Render) -> None:
    """Default: the `router` target pushed beside the image (`<repository>-router`, same tag);
    router.image overrides either part. Workers keep the full image."""
    defaults = render(
        {"image": {"repository": "reg.example/pdserve", "tag": "1.2"}}, RELEASE, NAMESPACE
    )
    assert container(defaults, "router")["image"] == "reg.example/pdserve-router:1.2"
    for role in WORKERS:
        assert container(defaults, role)["image"] == "reg.example/pdserve:1.2"
    chosen = render(
        {"router": {"image": {"repository": "reg.example/lean-router", "tag": "7"}}},
        RELEASE,
        NAMESPACE,
    )
    assert container(chosen, "router")["image"] == "reg.example/lean-router:7"
    untagged = render({}, RELEASE, NAMESPACE)  # no tag anywhere: the chart's appVersion
    assert container(untagged, "router")["image"] == "pdserve-router:0.1.0"


def test_workers_load_the_model_and_read_engine_settings_from_a_configmap(
    render: Render, contract_worker_flags: frozenset[str]
) -> None:
    objects = render(
        {
            "engine": {"maxNumSeqs": 32, "kvCacheDtype": "int8"},
            "decode": {"engine": {"numSwapBlocks": 512}},
        },
        RELEASE,
        NAMESPACE,
    )
    for role in ROLES:  # the router tokenizes with the same model the workers run
        assert flag(container(objects, role)["args"], "--model") == "/models/smollm2-135m-instruct"
    for role in WORKERS:
        main = container(objects, role)
        config_name = main["envFrom"][0]["configMapRef"]["name"]
        data = one(objects, "ConfigMap", config_name)["data"]
        for key in data:
            assert key.startswith("PDSERVE_"), key
            contract_flag = "--" + key.removeprefix("PDSERVE_").lower().replace("_", "-")
            assert contract_flag in contract_worker_flags, f"{key}: no {contract_flag} in contract"
        assert data["PDSERVE_BLOCK_SIZE"] == "16"
        assert data["PDSERVE_MAX_NUM_SEQS"] == "32"
        assert data["PDSERVE_KV_CACHE_DTYPE"] == "int8"  # both tiers: layouts must match
        assert ("PDSERVE_NUM_SWAP_BLOCKS" in data) == (role == "decode")
        env = {e["name"]: e for e in main["env"]}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["UCX_TLS"]["value"] == "tcp"
        threads = env["OMP_NUM_THREADS"]["valueFrom"]["resourceFieldRef"]  # as --pod-cpus
        assert threads == {"resource": "limits.cpu", "divisor": "1"}


def test_speculative_decoding_is_a_decode_engine_setting(render: Render) -> None:
    objects = render(
        {"decode": {"engine": {"speculative": "ngram", "numSpeculativeTokens": 6}}},
        RELEASE,
        NAMESPACE,
    )
    decode = one(objects, "ConfigMap", f"{name_of('decode')}-engine")["data"]
    assert decode["PDSERVE_SPECULATIVE"] == "ngram"
    assert decode["PDSERVE_NUM_SPECULATIVE_TOKENS"] == "6"
    prefill = one(objects, "ConfigMap", f"{name_of('prefill')}-engine")["data"]
    assert "PDSERVE_SPECULATIVE" not in prefill


def test_overrides_scale_gpus_and_monitoring(render: Render) -> None:
    from_values = {
        "prefill": {"autoscaling": {"enabled": False}, "replicas": 3, "gpu": {"enabled": True}},
        "decode": {"autoscaling": {"enabled": False}, "replicas": 5},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "router": {"service": {"type": "LoadBalancer"}},
    }
    objects = render(from_values, RELEASE, NAMESPACE)
    assert kinds(objects, "HorizontalPodAutoscaler") == {}
    assert one(objects, "Deployment", name_of("prefill"))["spec"]["replicas"] == 3
    assert one(objects, "Deployment", name_of("decode"))["spec"]["replicas"] == 5
    assert container(objects, "prefill")["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container(objects, "decode")["resources"].get("limits", {})
    prefill_config = one(objects, "ConfigMap", f"{name_of('prefill')}-engine")["data"]
    assert prefill_config["PDSERVE_DEVICE"] == "cuda"  # a GPU tier runs on the GPU
    assert "PDSERVE_DEVICE" not in one(objects, "ConfigMap", f"{name_of('decode')}-engine")["data"]
    monitor = one(objects, "ServiceMonitor", f"{RELEASE}-pdserve")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert one(objects, "Service", name_of("router"))["spec"]["type"] == "LoadBalancer"


def test_each_tier_scales_on_its_own_metric(render: Render) -> None:
    objects = render(
        {
            "prefill": {"autoscaling": {"podsMetric": {"enabled": True}, "maxReplicas": 6}},
            "decode": {"autoscaling": {"podsMetric": {"enabled": True}, "cpu": {"enabled": False}}},
        },
        RELEASE,
        NAMESPACE,
    )
    hpas = kinds(objects, "HorizontalPodAutoscaler")
    prefill, decode = hpas[name_of("prefill")]["spec"], hpas[name_of("decode")]["spec"]
    assert [m["type"] for m in prefill["metrics"]] == ["Resource", "Pods"]
    assert prefill["metrics"][1]["pods"]["metric"]["name"] == "pdserve_prefill_queue_depth"
    assert (prefill["minReplicas"], prefill["maxReplicas"]) == (1, 6)
    assert [m["type"] for m in decode["metrics"]] == ["Pods"]
    assert decode["metrics"][0]["pods"]["metric"]["name"] == "pdserve_decode_kv_usage"


def test_with_the_autoscaler_on_both_tier_hpas_follow_its_desired_replicas(
    render: Render,
) -> None:
    autoscaler = {
        "enabled": True,
        "profileConfigMap": "pdserve-profile",
        "podCpus": 0.5,
        "metricLabels": {"namespace": NAMESPACE},
    }
    objects = render(
        {"autoscaler": autoscaler, "router": {"placement": "adaptive"}}, RELEASE, NAMESPACE
    )
    hpas = kinds(objects, "HorizontalPodAutoscaler")
    assert set(hpas) == {name_of(tier) for tier in WORKERS}  # the router's stays off
    for tier in WORKERS:
        spec = hpas[name_of(tier)]["spec"]
        (metric,) = spec["metrics"]
        assert metric["type"] == "External"
        assert metric["external"]["metric"] == {
            "name": "pdserve_autoscale_desired_replicas",
            "selector": {"matchLabels": {"tier": tier, "namespace": NAMESPACE}},
        }
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
        assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 0
        assert "replicas" not in one(objects, "Deployment", name_of(tier))["spec"]
    pod = one(objects, "Deployment", name_of("autoscaler"))["spec"]["template"]["spec"]
    (scaler,) = pod["containers"]
    args = scaler["args"]
    assert args[0] == "autoscale" and flag(args, "--export-port") == "9103"
    headless = f"{name_of('router')}-headless.{NAMESPACE}.svc.cluster.local"
    assert flag(args, "--metrics-url") == f"http://{headless}:9100/metrics"
    assert flag(args, "--placement") == "adaptive" and flag(args, "--pod-cpus") == "0.5"
    assert flag(args, "--profile") == "/etc/pdserve/profile/profile.json"
    assert scaler["envFrom"] == [{"configMapRef": {"name": f"{name_of('decode')}-engine"}}]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["profile"]["configMap"]["name"] == "pdserve-profile"
    assert pod["automountServiceAccountToken"] is False  # no API access: no RBAC
    service = one(objects, "Service", name_of("autoscaler"))
    assert service["metadata"]["labels"]["pdserve.io/metrics"] == "true"  # the ServiceMonitor's


def test_pods_run_as_non_root_on_a_read_only_root(defaults: list[Manifest]) -> None:
    for role in ROLES:
        pod = one(defaults, "Deployment", name_of(role))["spec"]["template"]["spec"]
        main = container(defaults, role)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        mounts = {m["mountPath"] for m in main["volumeMounts"] if m["name"] in empty_dirs}
        assert {"/tmp", "/home/pdserve/.cache"} <= mounts


def test_helm_test_hook_calls_generate_through_the_router(
    defaults: list[Manifest], contract: dict[str, Any]
) -> None:
    hooks = [o for o in defaults if o["metadata"].get("annotations", {}).get("helm.sh/hook")]
    assert len(hooks) == 1
    pod = hooks[0]
    assert pod["kind"] == "Pod"
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    main = pod["spec"]["containers"][0]
    assert "pdserve generate --address" in main["args"][0]
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["ROUTER_ADDRESS"] == f"{name_of('router')}:{contract['router'].grpc_port}"
    assert env["MAX_TOKENS"] == "4"
    assert main["image"] == container(defaults, "router")["image"]


def test_ucx_env_reaches_the_workers_only_and_the_model_volume_every_role(render: Render) -> None:
    objects = render(
        {
            "ucx": {"tls": "rc,tcp", "netDevices": "mlx5_0:1", "tcpPortRange": "50100-50200"},
            "model": {"volume": {"persistentVolumeClaim": {"claimName": "models"}}},
        },
        RELEASE,
        NAMESPACE,
    )
    expected_ucx = {
        "UCX_TLS": "rc,tcp",
        "UCX_NET_DEVICES": "mlx5_0:1",
        "UCX_TCP_PORT_RANGE": "50100-50200",
    }
    for role in ROLES:
        main = container(objects, role)
        env = {e["name"]: e.get("value") for e in main["env"]}
        ucx = {name: value for name, value in env.items() if name.startswith("UCX_")}
        assert ucx == (expected_ucx if role in WORKERS else {})
        pod = one(objects, "Deployment", name_of(role))["spec"]["template"]["spec"]
        claims = [
            v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v
        ]
        mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
        assert claims == [{"claimName": "models"}]
        assert mounts["/models/smollm2-135m-instruct"]["readOnly"] is True


def test_http_port_zero_turns_the_openai_api_off(render: Render) -> None:
    objects = render({"router": {"httpPort": 0}}, RELEASE, NAMESPACE)
    router = container(objects, "router")
    assert flag(router["args"], "--http-port") == "0"
    assert "http" not in {p["name"] for p in router["ports"]}
    service = one(objects, "Service", name_of("router"))
    assert "http" not in {p["name"] for p in service["spec"]["ports"]}


def test_grafana_dashboard_is_off_by_default_and_carries_the_sidecar_label(
    defaults: list[Manifest], render: Render
) -> None:
    name = f"{RELEASE}-pdserve-grafana-dashboard"
    assert name not in kinds(defaults, "ConfigMap")
    objects = render({"metrics": {"grafanaDashboard": {"enabled": True}}}, RELEASE, NAMESPACE)
    config_map = one(objects, "ConfigMap", name)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["pdserve.json"])
    assert dashboard == json.loads(DASHBOARD.read_text())
    titles = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert titles == ["Router", "Prefill", "Decode"]


def test_router_placement_values_become_its_flags(render: Render) -> None:
    """What an adaptive `pdserve plan` writes reaches the router as --placement, --profile and
    --max-num-batched-tokens, and the SLOs admission refuses by as --slo-ttft and --slo-tpot;
    unset, the router keeps its defaults (no flag)."""
    values = {"placement": "adaptive", "profile": "/etc/pdserve/profile.json"}
    slos = {"sloTtftSeconds": 2.0, "sloTpotSeconds": 0.15}
    router = {**values, "maxNumBatchedTokens": 512, **slos}
    args = container(render({"router": router}, RELEASE, NAMESPACE), "router")["args"]
    assert flag(args, "--placement") == "adaptive"
    assert flag(args, "--profile") == "/etc/pdserve/profile.json"
    assert flag(args, "--max-num-batched-tokens") == "512"
    assert (flag(args, "--slo-ttft"), flag(args, "--slo-tpot")) == ("2", "0.15")
    defaults = container(render({}, RELEASE, NAMESPACE), "router")["args"]
    assert flag(defaults, "--placement") is None
    assert flag(defaults, "--slo-ttft") is None


def test_tenants_and_kv_offload_values_reach_their_pods(render: Render) -> None:
    tenants = {"default": {"weight": 1}, "tenants": {"batch": {"tokens_per_second": 2000}}}
    objects = render(
        {
            "router": {"tenants": tenants},
            "engine": {"kvOffloadHostGb": 1},
            "kvOffloadDisk": {"enabled": True, "sizeGb": 4},
        },
        RELEASE,
        NAMESPACE,
    )
    tenants_file = one(objects, "ConfigMap", f"{name_of('router')}-tenants")["data"]
    assert yaml.safe_load(tenants_file["tenants.yaml"]) == tenants
    for role in ROLES:
        main = container(objects, role)
        pod = one(objects, "Deployment", name_of(role))["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in main["env"]}
        if role == "router":
            assert flag(main["args"], "--tenants") == "/etc/pdserve/tenants/tenants.yaml"
            assert mounts["tenants"] == "/etc/pdserve/tenants"
            assert "kv-offload" not in volumes and "PDSERVE_KV_OFFLOAD_DISK_PATH" not in env
            continue
        assert flag(main["args"], "--tenants") is None and "tenants" not in volumes
        assert env["PDSERVE_KV_OFFLOAD_DISK_PATH"] == mounts["kv-offload"]
        assert env["PDSERVE_KV_OFFLOAD_DISK_GB"] == "4"
        assert volumes["kv-offload"]["emptyDir"]["sizeLimit"] == "4400M"  # 10 % headroom
        engine = one(objects, "ConfigMap", main["envFrom"][0]["configMapRef"]["name"])["data"]
        assert engine["PDSERVE_KV_OFFLOAD_HOST_GB"] == "1"
