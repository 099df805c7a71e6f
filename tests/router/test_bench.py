"""The router benchmark's parts: percentiles, the report, and its paths against fake tiers."""

from __future__ import annotations

import asyncio

import grpc

from pdserve.bench.router.cli import (
    PROMPT_IDS,
    BareRelay,
    _direct_path,
    _measure,
    _router_path,
    percentile,
    report,
)
from pdserve.client import GenerationClient
from pdserve.testing.fake_tiers import fake_tiers
from pdserve.v1 import generation_pb2_grpc


def test_percentile_picks_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 51.0  # round(0.5 * 99) = 50 -> the 51st value
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0


def test_report_shows_each_path_against_the_baseline() -> None:
    text = report({"base": [0.001] * 10, "other": [0.0015] * 10}, baseline="base")
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["path", "n", "p50"]
    assert lines[2].split() == ["other", "10", "1.500", "1.500", "1.500", "0.500", "0.500"]


def test_direct_and_relay_paths_run_against_fake_tiers() -> None:
    async def body() -> None:
        async with fake_tiers() as tiers:
            prefill, decode = tiers.prefill_addresses[0], tiers.decode_addresses[0]
            server = grpc.aio.server()
            generation_pb2_grpc.add_GenerationServicer_to_server(BareRelay(prefill, decode), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            async with GenerationClient.connect(f"127.0.0.1:{port}") as client:
                paths = {
                    "direct": _direct_path(prefill, decode, max_tokens=3),
                    "relay": _router_path(client, PROMPT_IDS, max_tokens=3),
                }
                samples = await _measure(paths, requests=6, warmup=1, rounds=2)
            await server.stop(None)
            assert {name: len(values) for name, values in samples.items()} == {
                "direct": 6,
                "relay": 6,
            }
            assert all(value > 0 for values in samples.values() for value in values)
            assert len(tiers.decode[0].reserves) == 14  # (1 warm-up + 6 timed) x 2 paths

    asyncio.run(body())
