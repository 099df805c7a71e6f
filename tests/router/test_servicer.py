"""The router's public API over fake prefill/decode tiers: the request flow and worker choice.

Retries, cancellation, deadlines and overload are in test_servicer_failures.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pdserve.client import build_request
from pdserve.router.validation import RequestValidator
from pdserve.testing.fake_tiers import FIRST_TOKEN_ID
from pdserve.v1 import common_pb2

PROMPT = "The capital of France is"


def sampling(**fields: Any) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(**fields)


def test_unary_generate_runs_reserve_prefill_generate(
    router_stack: Any, validator: RequestValidator
) -> None:
    async def body() -> None:
        async with router_stack() as stack:
            request = build_request(PROMPT, sampling=sampling(max_tokens=4), request_id="r-1")
            reply = await stack.client.generate(request, timeout=10)
            prompt_ids = validator.tokenizer.encode(PROMPT)
            assert reply.request_id == "r-1"
            assert list(reply.token_ids) == [FIRST_TOKEN_ID, 1, 2, 3]
            assert reply.text == f"<{FIRST_TOKEN_ID}><1><2><3>"
            assert reply.finish_reason == common_pb2.FINISH_REASON_LENGTH
            assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
                len(prompt_ids),
                4,
            )
            timings = reply.timings
            assert timings.prefill_seconds == pytest.approx(0.002)
            assert timings.transfer_seconds == pytest.approx(0.003)
            assert timings.queue_seconds >= 0.001  # the prefill worker's own queue time, at least
            assert 0 < timings.first_token_seconds <= timings.total_seconds
            # Both tiers saw the router's tokenization and the decode worker's reservation.
            (reserve,) = stack.tiers.decode[0].reserves
            assert list(reserve.request.prompt_token_ids) == prompt_ids
            assert reserve.request.sampling.max_tokens == 4
            (prefill,) = stack.tiers.prefill[0].calls
            assert list(prefill.request.prompt_token_ids) == prompt_ids
            # Both under the router's own id; the client's is only echoed.
            assert prefill.destination.request_id == reserve.request.request_id != "r-1"
            assert len(prefill.destination.transfer_token) == 16
            assert stack.tiers.decode[0].aborts == []

    asyncio.run(body())


def test_stream_relays_deltas_and_ends_with_usage_and_timings(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack:
            request = build_request([5, 6, 7], sampling=sampling(max_tokens=3))
            chunks = [chunk async for chunk in stack.client.generate_stream(request, timeout=10)]
            assert [list(chunk.token_ids) for chunk in chunks] == [[FIRST_TOKEN_ID], [1], [2]]
            assert "".join(chunk.text for chunk in chunks) == f"<{FIRST_TOKEN_ID}><1><2>"
            assert len({chunk.request_id for chunk in chunks}) == 1 and chunks[0].request_id
            assert not any(chunk.HasField("usage") for chunk in chunks[:-1])
            last = chunks[-1]
            assert last.finish_reason == common_pb2.FINISH_REASON_LENGTH
            assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (3, 3)
            assert last.timings.total_seconds >= last.timings.first_token_seconds > 0

    asyncio.run(body())


def test_least_loaded_workers_are_picked_in_each_tier(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_prefill=2, num_decode=2) as stack:
            busy_prefill, idle_prefill = stack.tiers.prefill
            idle_decode, busy_decode = stack.tiers.decode
            busy_prefill.knobs.load = common_pb2.LoadResponse(num_waiting=4)
            busy_decode.knobs.load = common_pb2.LoadResponse(num_waiting=1, num_running=8)
            await stack.registry.poll()
            await stack.client.generate(build_request([1]), timeout=10)
            assert (len(busy_prefill.calls), len(idle_prefill.calls)) == (0, 1)
            assert (len(idle_decode.reserves), len(busy_decode.reserves)) == (1, 0)

    asyncio.run(body())


def test_info_reports_the_model_and_limits(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(max_queue=7) as stack:
            info = await stack.client.info(timeout=10)
            assert info.model_name == "smollm2-135m-instruct"
            assert info.vocab_size == 49152
            assert info.max_context_length == info.limits.max_prompt_tokens + 1
            assert info.limits.max_queued_requests == 7
            assert info.limits.max_stop_strings == 4
            assert list(info.eos_token_ids)
            assert info.block_size == 16

    asyncio.run(body())
