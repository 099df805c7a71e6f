"""The router benchmark's parts: percentiles, the report, and its paths against fake tiers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import grpc
import pytest

from pdserve.bench.router.capacity import (
    CapacityRow,
    format_rows,
    router_cpu_seconds,
    split_cores,
)
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


def test_capacity_rows_carry_the_issue_fields_and_cpu_comes_from_proc() -> None:
    row = CapacityRow(
        relay="multiplexed",
        concurrency=16,
        tokens_per_s=100.0,
        router_cpu=0.5,
        tokens_per_router_cpu_s=200.0,
        gap_p50_ms=1.0,
        gap_p99_ms=2.0,
        errors=0,
        step_ms=2.0,
        tokens_per_chunk=1.5,
    )
    fields = json.loads(format_rows([row], as_json=True))
    assert list(fields) == [
        "relay",
        "concurrency",
        "tokens_per_s",
        "router_cpu",
        "tokens_per_router_cpu_s",
        "gap_p50_ms",
        "gap_p99_ms",
        "errors",
        "step_ms",
        "tokens_per_chunk",
    ]
    assert format_rows([row], as_json=False).splitlines()[1].split()[:2] == ["multiplexed", "16"]
    before = router_cpu_seconds(os.getpid())
    sum(range(3_000_000))  # some CPU of our own
    assert router_cpu_seconds(os.getpid()) > before
    router_core, others = split_cores()
    assert router_core not in others and others


@pytest.mark.integration
def test_the_capacity_command_measures_both_relay_paths() -> None:
    """The door end to end: fakes and a router in processes of their own, one row per path."""
    command = [sys.executable, "-m", "pdserve", "bench", "router", "--capacity", "--json"]
    command += ["--concurrency", "4", "--duration", "1", "--clients", "1"]
    command += ["--tokens-per-request", "16", "--step-ms", "2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(row["relay"], row["concurrency"]) for row in rows] == [
        ("per-request", 4),
        ("multiplexed", 4),
    ]
    for row in rows:
        assert row["tokens_per_s"] > 0 and 0 < row["router_cpu"] <= 1.05, row
        assert row["errors"] == 0 and row["gap_p99_ms"] >= row["gap_p50_ms"] > 0, row
        # 4 streams at one token a step of 2 ms each: at most 2,000 tokens/s offered.
        assert row["step_ms"] == 2.0 and row["tokens_per_s"] < 2500 and row["tokens_per_chunk"] >= 1
