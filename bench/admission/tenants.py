"""Per-tenant load for `pdserve bench admission --tenants FILE`: every tenant the file lists is a
client of its own, sending its weighted share of the point's rate (its weight over the listed
tenants' sum) with its tenant header, each share a Poisson process of its own requests.

With `--flood NAME` every point runs twice per arm: with that tenant silent (`alone`) and with it
sending `--flood-factor` times its share (`flood`). The other tenants send the same requests at
the same arrivals both times, so each one's attainment under the flood is compared with its own
alone (issue: within 0.05). Without `--flood` a point runs once (`shared`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pdserve.bench.disagg.cli import Point, hash_seed
from pdserve.bench.disagg.send import plan_load
from pdserve.bench.disagg.workload import PlannedRequest, RequestClass, plan_requests, point_seed
from pdserve.loadtest.calls import CallResult
from pdserve.loadtest.driver import drive
from pdserve.router.tenants import TenantConfig

ALONE, FLOOD, SHARED = "alone", "flood", "shared"


@dataclass(frozen=True)
class TenantLoad:
    tenant: str
    rate: float
    plan: tuple[PlannedRequest, ...]
    schedule_seed: int


@dataclass(frozen=True)
class Flood:
    tenant: str
    factor: float = 5.0


def scenarios(flood: Flood | None) -> tuple[str, ...]:
    return (ALONE, FLOOD) if flood is not None else (SHARED,)


def tenant_loads(
    point: Point,
    config: TenantConfig,
    classes: tuple[RequestClass, ...],
    duration_s: float,
    vocab_size: int,
    base_seed: int,
    flood: Flood | None,
    scenario: str,
) -> list[TenantLoad]:
    """What each listed tenant sends in one scenario of the point (a silent one sends nothing)."""
    names = sorted(config.tenants)
    total_weight = sum(config.weight(name) for name in names)
    loads = []
    for name in names:
        rate = point.rate * config.weight(name) / total_weight
        if flood is not None and name == flood.tenant:
            if scenario == ALONE:
                continue
            rate *= flood.factor
        label = f"rate={point.rate}/repeat={point.repeat}/tenant={name}/x{rate / point.rate:g}"
        seed = point_seed(base_seed, label)
        count = max(1, round(rate * duration_s))
        plan = plan_requests(classes, count, vocab_size, seed)
        loads.append(TenantLoad(name, rate, plan, hash_seed(seed)))
    return loads


def send_tenants(
    router: str, loads: list[TenantLoad], header: str, with_slo: bool
) -> dict[str, tuple[CallResult, ...]]:
    """Every tenant's requests at once, each tenant a client of its own; results by tenant."""
    configs = [
        plan_load(
            router, load.plan, load.rate, load.schedule_seed, with_slo, ((header, load.tenant),)
        )
        for load in loads
    ]

    async def together() -> list[tuple[CallResult, ...]]:
        reports = await asyncio.gather(*(drive(config) for config in configs))
        return [report.results for report in reports]

    return dict(zip((load.tenant for load in loads), asyncio.run(together()), strict=True))


def _as(header: str, load: TenantLoad) -> tuple[tuple[str, str], ...]:
    return ((header, load.tenant),)
