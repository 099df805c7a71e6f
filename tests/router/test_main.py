"""`pdserve router`: flags (and PDSERVE_* env), start-up readiness, metrics, drain."""

from __future__ import annotations

import argparse
import asyncio
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.cli import build_parser
from pdserve.client import GenerationClient, build_request
from pdserve.core.serving.server import ServerConfig
from pdserve.local.ports import free_port
from pdserve.router.main import ModelSource, build_router, router_config_from_args, run, serve
from pdserve.testing.fake_tiers import fake_tiers
from pdserve.v1 import common_pb2
from tests.fakes import PROFILE_OTHER_HOST


def parse(*argv: str) -> argparse.Namespace:
    args: argparse.Namespace = build_parser(["router", *argv]).parse_args(["router", *argv])
    return args


def test_defaults_follow_the_contract() -> None:
    args = parse()
    assert (args.port, args.metrics_port, args.host) == (50051, 9100, "0.0.0.0")
    config = router_config_from_args(args)
    assert config.resolve_interval_seconds == 5.0
    assert config.prefill_targets == "127.0.0.1:50061"
    assert config.decode_targets == "127.0.0.1:50071"
    assert config.http_port == 8000  # the OpenAI HTTP door


def test_flags_read_pdserve_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_MAX_QUEUE", "5")
    monkeypatch.setenv("PDSERVE_HTTP_PORT", "0")
    monkeypatch.setenv("PDSERVE_DECODE", "dns:///decode.ns.svc.cluster.local:50071")
    config = router_config_from_args(parse("--prefill", "p0:1,p1:1"))
    assert config.max_queue == 5
    assert config.http_port == 0
    assert config.decode_targets.startswith("dns:///")
    assert config.prefill_targets == "p0:1,p1:1"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--prefill", "nowhere"], "--prefill"),
        (["--decode", "dns:///no-port"], "--decode"),
        (["--max-queue", "0"], "--max-queue"),
        (["--max-attempts", "0"], "--max-attempts"),
        (["--resolve-interval-seconds", "0"], "--resolve-interval-seconds"),
        (["--http-port", "70000"], "--http-port"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(parse(*argv)) == 2
    assert f"pdserve router: {flag}: " in capsys.readouterr().err


async def _readiness(target: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="pdserve.v1.Generation")
        reply = await stub.Check(request, timeout=2)
        return int(reply.status)


def test_router_becomes_ready_serves_metrics_and_drains(model_dir: Path) -> None:
    async def body() -> None:
        async with fake_tiers() as tiers:
            port, metrics_port = free_port(), free_port()
            router = build_router(
                router_config_from_args(
                    parse(
                        "--prefill",
                        tiers.prefill_addresses[0],
                        "--decode",
                        tiers.decode_addresses[0],
                        "--http-port",
                        "0",
                    )
                ),
                ServerConfig("127.0.0.1", port, metrics_port, drain_grace_seconds=5.0),
            )
            serving = asyncio.create_task(serve(router, ModelSource(str(model_dir), None)))
            target = f"127.0.0.1:{port}"
            for _ in range(1200):  # up to 120 s: the first transformers import is slow on CI
                await asyncio.sleep(0.1)
                if await _readiness(target) == health_pb2.HealthCheckResponse.SERVING:
                    break
            assert await _readiness(target) == health_pb2.HealthCheckResponse.SERVING

            tiers.decode[0].knobs.delay_seconds = 0.05
            async with GenerationClient.connect(target) as client:
                sampling = common_pb2.SamplingParams(max_tokens=10)
                stream = client.generate_stream(build_request("Hi", sampling=sampling), timeout=10)
                first = await anext(stream)
                router.host.request_stop()  # as SIGTERM does
                rest = [chunk async for chunk in stream]  # in-flight work finishes
            assert len(first.token_ids) + sum(len(c.token_ids) for c in rest) == 10
            assert rest[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
            await asyncio.wait_for(serving, timeout=10)

            url = f"http://127.0.0.1:{metrics_port}/metrics"
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())
            assert 'pdserve_router_requests_total{code="OK",method="GenerateStream"}' in text
            assert "pdserve_router_time_to_first_token_seconds_count" in text

    asyncio.run(body())


def test_adaptive_placement_needs_a_profile() -> None:
    with pytest.raises(ValueError, match="--placement adaptive: needs --profile"):
        router_config_from_args(parse("--placement", "adaptive"))
    with pytest.raises(ValueError, match="--itl-slo: needs --profile"):
        router_config_from_args(parse("--itl-slo", "0.2"))


def test_adaptive_placement_reads_the_cost_model_once() -> None:
    args = parse(
        "--placement", "adaptive", "--profile", str(PROFILE_OTHER_HOST), "--itl-slo", "0.2"
    )
    config = router_config_from_args(args)
    assert config.costs is not None
    assert (config.costs.itl_slo_s, config.costs.max_num_batched_tokens) == (0.2, 2048)
    assert config.placement.router_flags()[:2] == ("--placement", "adaptive")


def test_a_bad_profile_is_refused_naming_it(tmp_path: Path) -> None:
    broken = tmp_path / "profile.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match="profile"):
        router_config_from_args(parse("--placement", "adaptive", "--profile", str(broken)))
