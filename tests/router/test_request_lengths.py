"""The router's length histograms (what `pdserve autoscale` sizes for): one observation per
finished request, through the real router over fake tiers."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import REGISTRY

from pdserve.client import SamplingParams, build_request


def _count(name: str, le: str) -> float:
    return REGISTRY.get_sample_value(f"{name}_bucket", {"le": le}) or 0.0


def test_each_finished_request_adds_its_prompt_and_output_lengths(router_stack: Any) -> None:
    prompt_le_8 = _count("pdserve_router_prompt_tokens", "8.0")
    prompt_le_4 = _count("pdserve_router_prompt_tokens", "4.0")
    output_le_4 = _count("pdserve_router_output_tokens", "4.0")
    output_le_2 = _count("pdserve_router_output_tokens", "2.0")

    async def body() -> None:
        async with router_stack() as stack:
            sampling = SamplingParams(max_tokens=3, temperature=0.0)
            for _ in range(2):
                await stack.client.generate(build_request([5, 6, 7, 8, 9, 10], sampling=sampling))

    asyncio.run(body())
    # 6 prompt tokens: in the 8 bucket, not the 4; 3 output tokens: in the 4 bucket, not the 2.
    assert _count("pdserve_router_prompt_tokens", "8.0") - prompt_le_8 == 2
    assert _count("pdserve_router_prompt_tokens", "4.0") - prompt_le_4 == 0
    assert _count("pdserve_router_output_tokens", "4.0") - output_le_4 == 2
    assert _count("pdserve_router_output_tokens", "2.0") - output_le_2 == 0
