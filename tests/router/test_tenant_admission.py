"""Priority displacement, tenants' fair shares and rate limits through the real router over fake
tiers: decode's fake answers Reserve half a second late, so admitted requests wait unstarted (as
in a worker's queue) and may be displaced; the displaced ones are told so at once with a retry
delay and cancelled on the workers, never dropped silently."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import openai
import pytest
from prometheus_client import REGISTRY

from pdserve.client import GenerationClient, build_request
from pdserve.router.tenants import parse_tenants
from pdserve.v1 import common_pb2

from .test_http import openai_client

SAMPLING = common_pb2.SamplingParams(max_tokens=3)
TENANTS = parse_tenants(
    {
        "tenants": {
            "alice": {"weight": 1},
            "bob": {"weight": 1},
            "carol": {"requests_per_second": 1, "api_keys": ["sk-carol"]},
        }
    },
    "test",
)


def outcomes(tenant: str, outcome: str) -> float:
    labels = {"tenant": tenant, "outcome": outcome}
    return REGISTRY.get_sample_value("pdserve_router_tenant_requests_total", labels) or 0.0


async def call(
    client: GenerationClient, priority: int = 0, tenant: str | None = None
) -> grpc.StatusCode:
    metadata = () if tenant is None else (("x-pdserve-tenant", tenant),)
    try:
        await client.generate(
            build_request([1, 2, 3], sampling=SAMPLING, priority=priority),
            timeout=30,
            metadata=metadata,
        )
    except grpc.aio.AioRpcError as error:
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
        trailers = dict(error.trailing_metadata() or ())
        assert trailers["grpc-retry-pushback-ms"] == "1000"
        return error.code()
    return grpc.StatusCode.OK


async def until_held(stack: Any, places: int) -> None:
    while stack.servicer.admission.places.in_flight < places:
        await asyncio.sleep(0.01)


def test_a_higher_priority_request_displaces_a_queued_one_which_is_told_why(
    router_stack: Any,
) -> None:
    async def body() -> None:
        async with router_stack(max_queue=2) as stack:
            stack.tiers.decode[0].knobs.delay_seconds = 0.5
            low = [asyncio.create_task(call(stack.client)) for _ in range(2)]
            await until_held(stack, 2)
            before = outcomes("default", "displaced")
            high = await call(stack.client, priority=5)
            codes = await asyncio.gather(*low)
            assert high is grpc.StatusCode.OK
            assert sorted(code.name for code in codes) == ["OK", "RESOURCE_EXHAUSTED"]
            assert outcomes("default", "displaced") == before + 1
            # The displaced request was cancelled on its worker, not left to run there.
            while not stack.tiers.decode[0].cancelled:
                await asyncio.sleep(0.01)
            assert stack.servicer.admission.places.in_flight == 0

    asyncio.run(body())


def test_one_tenant_flooding_cannot_take_another_tenants_share(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(max_queue=4, tenants=TENANTS) as stack:
            stack.tiers.decode[0].knobs.delay_seconds = 0.5
            flood = [asyncio.create_task(call(stack.client, tenant="alice")) for _ in range(4)]
            await until_held(stack, 4)
            bob = asyncio.create_task(call(stack.client, tenant="bob"))
            await asyncio.sleep(0.2)  # bob displaced one of alice's four: alice holds 3 of 4
            before = outcomes("alice", "fair_share")
            assert await call(stack.client, tenant="alice") is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert outcomes("alice", "fair_share") == before + 1
            assert await bob is grpc.StatusCode.OK
            codes = await asyncio.gather(*flood)
            assert sorted(code.name for code in codes) == ["OK"] * 3 + ["RESOURCE_EXHAUSTED"]

    asyncio.run(body())


def test_a_tenant_past_its_rate_is_refused_at_both_doors(router_stack: Any) -> None:
    """carol (by her API key) may send one request a second; others are not limited."""

    async def body() -> None:
        async with router_stack(tenants=TENANTS) as stack:
            key = (("authorization", "Bearer sk-carol"),)
            request = build_request([1, 2, 3], sampling=SAMPLING)
            await stack.client.generate(request, timeout=10, metadata=key)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stack.client.generate(request, timeout=10, metadata=key)
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "tenant 'carol' is past its rate limits" in (refused.value.details() or "")
            await stack.client.generate(request, timeout=10)  # another tenant: served
            async with openai_client(stack) as (client, model):
                carol = client.with_options(api_key="sk-carol")
                with pytest.raises(openai.APIStatusError) as caught:
                    await carol.completions.create(model=model, prompt=[1, 2], max_tokens=3)
                assert caught.value.status_code == 429
                assert float(caught.value.response.headers["retry-after"]) >= 1

    asyncio.run(body())
