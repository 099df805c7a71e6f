"""Bad requests get INVALID_ARGUMENT naming the field, before any worker is asked."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.router.config import RequestCaps
from pdserve.router.validation import ModelLimits, RequestValidator
from pdserve.v1 import common_pb2, generation_pb2

VOCAB = 49152
CONTEXT = 8192  # SmolLM2-135M's max_position_embeddings


def request(**fields: Any) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(**fields)


def ids(*token_ids: int, **fields: Any) -> generation_pb2.GenerateRequest:
    return request(prompt_token_ids=common_pb2.TokenIds(ids=list(token_ids)), **fields)


BAD_REQUESTS = [
    (request(), "prompt"),
    (request(prompt=""), "prompt"),
    (ids(), "prompt_token_ids"),
    (ids(1, VOCAB), "prompt_token_ids"),
    (ids(*range(CONTEXT)), "prompt_token_ids"),
    (ids(1, 2, sampling=common_pb2.SamplingParams(max_tokens=CONTEXT - 1)), "sampling.max_tokens"),
    (
        request(prompt="hi", sampling=common_pb2.SamplingParams(temperature=-1)),
        "sampling.temperature",
    ),
    (request(prompt="hi", sampling=common_pb2.SamplingParams(top_p=1.5)), "sampling.top_p"),
    *(
        (
            request(prompt="hi", sampling=common_pb2.SamplingParams(**{name: value})),
            f"sampling.{name}",
        )
        for name in ("temperature", "top_p")
        for value in (math.inf, -math.inf, math.nan)
    ),
    (request(prompt="hi", sampling=common_pb2.SamplingParams(top_k=-2)), "sampling.top_k"),
    (request(prompt="hi", sampling=common_pb2.SamplingParams(stop=["a"] * 5)), "sampling.stop"),
    (request(prompt="hi", sampling=common_pb2.SamplingParams(stop=[""])), "sampling.stop"),
    (request(prompt="hi", request_id=""), "request_id"),
    (request(prompt="hi", request_id="x" * 300), "request_id"),
]


@pytest.mark.parametrize(("bad", "field"), BAD_REQUESTS)
def test_validator_names_the_field(
    validator: RequestValidator, bad: generation_pb2.GenerateRequest, field: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        asyncio.run(validator.validate(bad))
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_valid_request_is_normalized(validator: RequestValidator) -> None:
    valid = asyncio.run(validator.validate(request(prompt="Hello world", priority=3)))
    assert valid.prompt_token_ids == tuple(validator.tokenizer.encode("Hello world"))
    assert valid.sampling.max_tokens == 16  # the documented default, filled in for the workers
    assert valid.sampling.top_p == 1.0
    assert valid.priority == 3
    assert len(valid.request_id) == 32  # a fresh uuid4 hex
    assert valid.client_request_id == valid.request_id  # echoed when the client set none


def test_the_routers_id_is_its_own_whatever_the_client_sent(validator: RequestValidator) -> None:
    first, second = (
        asyncio.run(validator.validate(request(prompt="hi", request_id="r/0"))) for _ in range(2)
    )
    assert first.client_request_id == second.client_request_id == "r/0"
    assert first.request_id != second.request_id
    assert "/" not in first.request_id  # no client id can name one of its samples


def test_long_prompt_is_tokenized_off_the_loop_the_same(validator: RequestValidator) -> None:
    text = "lorem ipsum dolor " * 400
    valid = asyncio.run(validator.validate(request(prompt=text)))
    assert valid.prompt_token_ids == tuple(validator.tokenizer.encode(text))


def test_server_answers_invalid_argument_and_asks_no_worker(router_stack: Any) -> None:
    labels = {"method": "Generate", "code": "INVALID_ARGUMENT"}
    before = REGISTRY.get_sample_value("pdserve_router_requests_total", labels) or 0.0

    async def body() -> None:
        async with router_stack() as stack:
            for bad, field in BAD_REQUESTS:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stack.client.generate(bad, timeout=10)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (caught.value.details() or "").startswith(f"{field}: ")
            assert stack.tiers.decode[0].reserves == []
            # The server keeps serving after all those refusals.
            reply = await stack.client.generate(ids(1, 2), timeout=10)
            assert reply.finish_reason == common_pb2.FINISH_REASON_LENGTH

    asyncio.run(body())
    after = REGISTRY.get_sample_value("pdserve_router_requests_total", labels)
    assert after == before + len(BAD_REQUESTS)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (ids(*range(1, 12)), "prompt_token_ids"),
        (request(prompt="one two three four five six seven eight nine ten eleven"), "prompt"),
        (ids(1, 2, sampling=common_pb2.SamplingParams(max_tokens=21)), "sampling.max_tokens"),
        (request(prompt="hi", sampling=common_pb2.SamplingParams(stop=["x" * 9])), "sampling.stop"),
        (
            request(prompt="hi", sampling=common_pb2.SamplingParams(stop_token_ids=[1, 2, 3])),
            "sampling.stop_token_ids",
        ),
    ],
)
def test_flag_caps_name_the_field(
    validator: RequestValidator, model_dir: Path, bad: generation_pb2.GenerateRequest, field: str
) -> None:
    caps = RequestCaps(
        max_prompt_tokens=10, max_tokens=20, max_stop_strings=2, max_stop_string_chars=8
    )
    capped = RequestValidator(validator.tokenizer, ModelLimits.from_model_dir(model_dir, caps))
    assert (capped.limits.max_prompt_tokens, capped.limits.max_tokens) == (10, 20)
    with pytest.raises(InvalidRequestError) as caught:
        asyncio.run(capped.validate(bad))
    assert caught.value.field == field
    asyncio.run(
        capped.validate(ids(*range(1, 11), sampling=common_pb2.SamplingParams(max_tokens=20)))
    )
