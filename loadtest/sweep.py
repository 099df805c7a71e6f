"""Runs one config at increasing request rates: the data for a latency-against-load curve."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TextIO

from pdserve.loadtest.config import LoadConfig, LoadConfigError
from pdserve.loadtest.driver import drive
from pdserve.loadtest.progress import Progress
from pdserve.loadtest.report import GoodputTargets, build_report


@dataclass(frozen=True)
class SweepPoint:
    """The report of one run at `offered_rps`."""

    offered_rps: float
    report: dict[str, Any]


def parse_rates(text: str) -> tuple[float, ...]:
    """'1,2,4,8' -> (1.0, 2.0, 4.0, 8.0): positive and increasing, else an error naming --sweep."""
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise LoadConfigError(f"--sweep: not a comma-separated list of rates: {text!r}") from error
    if not rates or any(rate <= 0 for rate in rates):
        raise LoadConfigError(f"--sweep: rates must be > 0, got {text!r}")
    if list(rates) != sorted(set(rates)):
        raise LoadConfigError(f"--sweep: rates must increase, got {text!r}")
    return rates


async def sweep(
    config: LoadConfig,
    rates: Sequence[float],
    targets: GoodputTargets,
    progress_stream: TextIO | None = None,
) -> list[SweepPoint]:
    """One run of `config` per rate (its concurrency caps calls in flight, as under ghz)."""
    points = []
    for rate in rates:
        if progress_stream is not None:
            progress_stream.write(f"--- offered load {rate:g} rps\n")
        run_config = replace(config, rps=rate)
        outcome = await drive(run_config, Progress(progress_stream), interruptible=True)
        points.append(SweepPoint(rate, build_report(run_config, outcome, targets)))
    return points


def sweep_document(points: Sequence[SweepPoint]) -> dict[str, Any]:
    """The JSON written for a sweep: one ghz-format report per offered rate."""
    return {"sweep": [{"offeredRps": p.offered_rps, "report": p.report} for p in points]}
