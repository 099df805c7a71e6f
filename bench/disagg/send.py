"""Sending a bench's planned requests through a router: Poisson arrivals, streamed, open loop
(the load runner, loadtest/driver.py). Shared by bench disagg, admission and autoscale."""

from __future__ import annotations

import asyncio

from pdserve.bench.disagg.workload import PlannedRequest
from pdserve.loadtest.calls import CallResult
from pdserve.loadtest.config import LoadConfig, Method
from pdserve.loadtest.driver import drive
from pdserve.loadtest.schedule import LoadSchedule


def send_plan(config: LoadConfig) -> tuple[CallResult, ...]:
    """Runs `config` (from `plan_load`) and waits for the last request to finish."""
    return asyncio.run(drive(config)).results


def plan_load(
    host: str,
    plan: tuple[PlannedRequest, ...],
    rate: float | None,
    schedule_seed: int,
    with_slo: bool = False,
    metadata: tuple[tuple[str, str], ...] = (),
    id_prefix: str | None = None,
    schedule: LoadSchedule = LoadSchedule.POISSON,
) -> LoadConfig:
    """The load runner's config that streams every planned request through the router at
    Poisson arrivals (or all at once: no rate), for `send_plan` (or several gathered in one event
    loop, `drive` of each). `with_slo`: each carries its class's TTFT SLO as its own
    (`GenerateRequest.slo`, what the router's admission judges); `metadata` goes with every
    call (e.g. a tenant header); `id_prefix`: request i carries `request_id` prefix + i;
    `schedule`: free Poisson gaps, or the plan's arrivals held within len(plan) / rate seconds
    (`poisson-window`: a trace's phase)."""
    return LoadConfig(
        method=Method.GENERATE_STREAM,
        host=host,
        data=tuple(
            request.call_data(with_slo, None if id_prefix is None else f"{id_prefix}{i}")
            for i, request in enumerate(plan)
        ),
        total=len(plan),
        concurrency=len(plan),  # open loop: no worker is ever the bottleneck
        rps=rate or 0.0,
        load_schedule=schedule,
        schedule_seed=schedule_seed,
        timeout_s=900.0,
        insecure=True,
        metadata=metadata,
    )
