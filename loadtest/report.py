"""Builds the ghz-format JSON report (ghz's field names and units: durations in nanoseconds,
histogram marks in seconds) plus a `generation` section with token-level metrics."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pdserve.loadtest.calls import CallResult
from pdserve.loadtest.config import LoadConfig
from pdserve.loadtest.driver import RunOutcome
from pdserve.loadtest.stats import histogram, latency_distribution, summary

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class GoodputTargets:
    """Service-level targets a streamed request must meet to count as goodput (None: no limit)."""

    ttft_s: float | None = None
    itl_s: float | None = None


def go_time(timestamp: float, *, whole_seconds: bool = False) -> str:
    """A wall-clock time as Go writes it in UTC: RFC 3339 (`date`) or RFC 3339 nano (details)."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    text = moment.isoformat(timespec="seconds" if whole_seconds else "microseconds")
    return text.replace("+00:00", "Z")


def build_report(
    config: LoadConfig, outcome: RunOutcome, targets: GoodputTargets | None = None
) -> dict[str, Any]:
    results = outcome.results[config.skip_first :]
    ok_latencies = sorted(result.latency_ns for result in results if result.ok)
    count = len(results)
    total_s = outcome.total_ns / NS_PER_S
    report: dict[str, Any] = {
        "endReason": outcome.end_reason.value,
        "options": _options(config),
        "date": go_time(time.time(), whole_seconds=True),
        "count": count,
        "total": outcome.total_ns,
        "average": round(sum(r.latency_ns for r in results) / count) if count else 0,
        "fastest": ok_latencies[0] if ok_latencies else 0,
        "slowest": ok_latencies[-1] if ok_latencies else 0,
        "rps": count / total_s if total_s > 0 else 0.0,
        "errorDistribution": dict(Counter(r.error for r in results if not r.ok)),
        "statusCodeDistribution": dict(Counter(r.status for r in results)),
        "latencyDistribution": latency_distribution(ok_latencies),
        "histogram": histogram(ok_latencies),
        "details": [_detail(result) for result in results],
        "generation": _generation(config, results, total_s, targets or GoodputTargets()),
    }
    if config.name:
        report["name"] = config.name
    if config.tags:
        report["tags"] = dict(config.tags)
    return report


def _options(config: LoadConfig) -> dict[str, Any]:
    return {
        "call": config.method.value.lstrip("/").replace("/", "."),
        "host": config.host,
        "insecure": config.insecure,
        "rps": config.rps,
        "load-schedule": config.load_schedule.value,
        "concurrency": config.concurrency,
        "concurrency-schedule": "const",
        "total": config.total,
        "connections": config.connections,
        "duration": round(config.duration_s * NS_PER_S),
        "timeout": round(config.timeout_s * NS_PER_S),
        "data": list(config.data) if len(config.data) > 1 else config.data[0],
        "metadata": dict(config.metadata),
        "binary": False,
        "CPUs": os.cpu_count() or 1,
        "name": config.name,
        "skipFirst": config.skip_first,
    }


def _detail(result: CallResult) -> dict[str, Any]:
    return {
        "timestamp": go_time(result.started_at),
        "latency": result.latency_ns,
        "error": result.error,
        "status": result.status,
    }


def _generation(
    config: LoadConfig, results: tuple[CallResult, ...], total_s: float, targets: GoodputTargets
) -> dict[str, Any]:
    ok = [result for result in results if result.ok]
    output_tokens = sum(result.output_tokens for result in ok)
    section: dict[str, Any] = {
        "outputTokens": output_tokens,
        "outputTokensPerSecond": output_tokens / total_s if total_s > 0 else 0.0,
    }
    if config.method.is_stream:
        section["timeToFirstToken"] = summary(
            [r.first_token_ns for r in ok if r.first_token_ns is not None]
        )
        section["interTokenLatency"] = summary([gap for r in ok for gap in r.token_gaps_ns])
        section["goodput"] = _goodput(ok, len(results), total_s, targets)
    return section


def _goodput(
    ok: list[CallResult], count: int, total_s: float, targets: GoodputTargets
) -> dict[str, Any]:
    good = sum(1 for result in ok if _meets(result, targets))
    return {
        "ttftTarget": None if targets.ttft_s is None else round(targets.ttft_s * NS_PER_S),
        "itlTarget": None if targets.itl_s is None else round(targets.itl_s * NS_PER_S),
        "count": good,
        "fraction": good / count if count else 0.0,
        "rps": good / total_s if total_s > 0 else 0.0,
    }


def _meets(result: CallResult, targets: GoodputTargets) -> bool:
    """TTFT within its target, and the request's mean inter-token latency within its target."""
    if result.first_token_ns is None:
        return False
    if targets.ttft_s is not None and result.first_token_ns > targets.ttft_s * NS_PER_S:
        return False
    gaps = result.token_gaps_ns
    mean_gap = sum(gaps) / len(gaps) if gaps else 0.0
    return targets.itl_s is None or mean_gap <= targets.itl_s * NS_PER_S
