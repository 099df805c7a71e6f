"""pdserve.client: the typed Generation client the load runner (and others) reuse."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request

from .conftest import REJECTION, FakeServer


def test_build_request_from_text_or_token_ids() -> None:
    text = build_request("hi", sampling=SamplingParams(max_tokens=3), priority=2, request_id="r1")
    assert text.WhichOneof("input") == "prompt" and text.sampling.max_tokens == 3
    assert (text.priority, text.request_id) == (2, "r1")
    tokens = build_request([5, 6])
    assert tokens.WhichOneof("input") == "prompt_token_ids"
    assert list(tokens.prompt_token_ids.ids) == [5, 6] and not tokens.HasField("request_id")


@pytest.mark.parametrize(
    ("prompt", "field"), [("", "prompt"), ([], "prompt_token_ids"), ([1, -2], "prompt_token_ids")]
)
def test_build_request_names_the_bad_field(prompt: str | list[int], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        build_request(prompt)


def test_generate_stream_info_and_errors(fake_server: FakeServer) -> None:
    async def scenario() -> None:
        async with GenerationClient.connect(fake_server.target) as client:
            reply = await client.generate(
                build_request("ok", sampling=SamplingParams(max_tokens=3))
            )
            assert list(reply.token_ids) == [0, 1, 2]
            chunks = [c async for c in client.generate_stream(build_request("ok"))]
            assert [list(c.token_ids) for c in chunks] == [[0], [1], [2], [3], []]
            assert chunks[-1].usage.completion_tokens == 4
            assert (await client.info()).model_name == "fake"
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await client.generate(build_request("bad"))
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert raised.value.details() == REJECTION

    asyncio.run(scenario())
