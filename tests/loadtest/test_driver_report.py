"""The load driver and the ghz-format report, against the fake Generation server."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from pdserve.loadtest.config import LoadConfig, config_from_dict
from pdserve.loadtest.driver import EndReason, drive
from pdserve.loadtest.report import GoodputTargets, build_report

from .conftest import REJECTION, FakeServer

GOOD = {"prompt": "ok", "sampling": {"max_tokens": 5}}
BAD = {"prompt": "bad"}


def _config(server: FakeServer, **keys: Any) -> LoadConfig:
    raw = {"host": server.target, "insecure": True, "data": [GOOD, BAD], **keys}
    raw.setdefault("call", "pdserve.v1.Generation.Generate")
    return config_from_dict(raw)


def _run(config: LoadConfig, targets: GoodputTargets | None = None) -> dict[str, Any]:
    report: dict[str, Any] = build_report(config, asyncio.run(drive(config)), targets)
    return report


def test_unary_report_counts_statuses_and_errors(fake_server: FakeServer) -> None:
    report = _run(_config(fake_server, total=40, concurrency=4))

    assert report["count"] == 40
    assert report["endReason"] == "normal"
    assert report["statusCodeDistribution"] == {"OK": 20, "InvalidArgument": 20}
    expected_error = f"rpc error: code = InvalidArgument desc = {REJECTION}"
    assert report["errorDistribution"] == {expected_error: 20}
    assert math.isclose(report["rps"], 40 / (report["total"] / 1e9))
    assert (
        0 < report["fastest"] <= report["average"] * 10 and report["fastest"] <= report["slowest"]
    )
    percentages = [entry["percentage"] for entry in report["latencyDistribution"]]
    assert percentages == [10, 25, 50, 75, 90, 95, 99]
    latencies = [entry["latency"] for entry in report["latencyDistribution"]]
    assert latencies == sorted(latencies) and latencies[-1] <= report["slowest"]
    assert len(report["histogram"]) == 11
    assert sum(bucket["count"] for bucket in report["histogram"]) == 20  # OK calls only
    assert report["generation"]["outputTokens"] == 20 * 5
    assert len(report["details"]) == 40
    assert {d["status"] for d in report["details"]} == {"OK", "InvalidArgument"}


def test_stream_report_has_token_metrics(fake_server: FakeServer) -> None:
    fake_server.servicer.token_delay_s = 0.01
    config = _config(
        fake_server, call="pdserve.v1.Generation/GenerateStream", total=8, concurrency=4
    )
    report = _run(config, GoodputTargets(ttft_s=5.0, itl_s=5.0))

    generation = report["generation"]
    assert report["statusCodeDistribution"] == {"OK": 4, "InvalidArgument": 4}
    assert generation["outputTokens"] == 4 * 5
    assert generation["timeToFirstToken"]["count"] == 4
    assert generation["interTokenLatency"]["count"] == 4 * 4  # 5 tokens: 4 gaps per request
    # The fake sleeps 10 ms before every token, so gaps and TTFT cannot be shorter than ~10 ms.
    assert generation["interTokenLatency"]["fastest"] >= 8_000_000
    assert generation["timeToFirstToken"]["fastest"] >= 8_000_000
    assert generation["timeToFirstToken"]["slowest"] < report["slowest"]
    assert generation["outputTokensPerSecond"] > 0
    assert generation["goodput"]["count"] == 4  # every OK request meets generous targets
    assert generation["goodput"]["fraction"] == 0.5


def test_goodput_excludes_requests_over_the_itl_target(fake_server: FakeServer) -> None:
    fake_server.servicer.token_delay_s = 0.01
    config = _config(
        fake_server, call="pdserve.v1.Generation.GenerateStream", total=4, concurrency=2
    )
    report = _run(config, GoodputTargets(itl_s=0.001))  # 1 ms: below the fake's 10 ms gaps

    assert report["generation"]["goodput"]["count"] == 0
    assert report["generation"]["goodput"]["itlTarget"] == 1_000_000


def test_rate_limit_spaces_the_calls(fake_server: FakeServer) -> None:
    config = _config(fake_server, total=10, concurrency=10, rps=40, data=[GOOD])
    report = _run(config)

    # Call i may start at (i + 1) / 40 s: ten calls span at least 10 / 40 s whatever the
    # concurrency.
    assert report["count"] == 10
    assert report["total"] >= 10 / 40 * 1e9
    assert report["rps"] <= 40 * 1.1


def test_duration_ends_with_timeout_and_cancels_calls_in_flight(fake_server: FakeServer) -> None:
    fake_server.servicer.token_delay_s = 0.05
    config = _config(
        fake_server,
        call="pdserve.v1.Generation.GenerateStream",
        duration="1s",
        concurrency=2,
        data=[{"prompt": "ok", "sampling": {"max_tokens": 1000}}],
    )
    outcome = asyncio.run(drive(config))

    assert outcome.end_reason is EndReason.TIMEOUT
    assert 0.9e9 <= outcome.total_ns < 3e9
    # Every call needed 50 s, so both in-flight calls were cut at 1 s and counted as Canceled.
    assert [r.status for r in outcome.results] == ["Canceled", "Canceled"]


def test_duration_stop_wait_lets_calls_finish(fake_server: FakeServer) -> None:
    config = _config(fake_server, duration="300ms", concurrency=2, data=[GOOD])
    config = config_from_dict({**_raw(config), "duration-stop": "wait"})
    outcome = asyncio.run(drive(config))

    assert outcome.end_reason is EndReason.TIMEOUT
    assert outcome.results and all(result.ok for result in outcome.results)


def test_a_rated_duration_run_ends_at_its_duration(fake_server: FakeServer) -> None:
    """Idle workers wait for turns far past the end (slot 63 at 64 s at 1 rps): closing the
    slots must wake them, or the run would last until the last turn instead of ~1.5 s."""
    config = _config(fake_server, duration="1500ms", concurrency=64, data=[GOOD])
    config = config_from_dict({**_raw(config), "rps": 1, "duration-stop": "wait"})
    outcome = asyncio.run(drive(config))

    assert outcome.total_ns < 5e9
    # One turn (at 1 s) falls inside the 1.5 s, as under ghz.
    assert len(outcome.results) == 1 and outcome.results[0].ok


def _raw(config: LoadConfig) -> dict[str, Any]:
    return {
        "call": "pdserve.v1.Generation.Generate",
        "host": config.host,
        "insecure": True,
        "data": list(config.data),
        "duration": f"{config.duration_s}s",
        "concurrency": config.concurrency,
    }
