"""The OpenAI HTTP door over fake tiers, driven by the official `openai` client: answers, SSE,
errors in OpenAI's shape, and a client disconnect cancelling the request on both tiers.

The same door against the real tiers and model is in tests/integration/test_http.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client import REGISTRY

from pdserve.core.serving.tls import ServerTls
from pdserve.router.http.app import HttpDoor, build_app, check_http_door
from pdserve.testing.fake_tiers import FIRST_TOKEN_ID


@contextlib.asynccontextmanager
async def openai_client(stack: Any) -> AsyncIterator[tuple[openai.AsyncOpenAI, str]]:
    """An `openai` client on an HTTP door serving the stack's admission, and the model name."""
    admission = stack.servicer.admission
    door = HttpDoor(build_app(admission, lambda: True), "127.0.0.1", 0, drain_seconds=1.0, tls=None)
    door.start()
    base_url = f"http://127.0.0.1:{door.port}/v1"
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        yield client, admission.loaded_validator().limits.model_name
    finally:
        await client.close()
        await door.stop()


def _count(path: str, code: str) -> float:
    labels = {"method": path, "code": code}
    return REGISTRY.get_sample_value("pdserve_router_requests_total", labels) or 0.0


EXPECTED = f"<{FIRST_TOKEN_ID}><1><2><3>"  # the fake decode's text for max_tokens=4


def test_completions_unary_and_streamed_with_usage(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack, openai_client(stack) as (client, model):
            reply = await client.completions.create(model=model, prompt="Hi", max_tokens=4)
            assert reply.choices[0].text == EXPECTED
            assert reply.choices[0].finish_reason == "length"
            assert reply.usage is not None and reply.usage.completion_tokens == 4
            stream = await client.completions.create(
                model=model,
                prompt=[1, 2, 3],
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            assert "".join(c.choices[0].text for c in chunks if c.choices) == EXPECTED
            assert chunks[-2].choices[0].finish_reason == "length"
            assert chunks[-1].choices == []
            assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 3

    asyncio.run(body())


def test_chat_stream_starts_with_the_assistant_role(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack, openai_client(stack) as (client, model):
            messages: Any = [{"role": "user", "content": "Hi"}]
            stream = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=4, stream=True
            )
            chunks = [chunk async for chunk in stream]
            assert chunks[0].choices[0].delta.role == "assistant"
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == EXPECTED
            assert all(chunk.usage is None for chunk in chunks)
            reply = await client.chat.completions.create(
                model=model, messages=messages, max_completion_tokens=4
            )
            assert reply.choices[0].message.content == EXPECTED
            # The prompt sent on is the chat template's rendering, not the bare message.
            prompt_len = len(stack.tiers.decode[0].reserves[-1].request.prompt_token_ids)
            assert prompt_len > 3

    asyncio.run(body())


def test_n_samples_answer_one_choice_each_with_usage_summed(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack, openai_client(stack) as (client, model):
            reply = await client.completions.create(model=model, prompt="Hi", max_tokens=4, n=3)
            assert [choice.index for choice in reply.choices] == [0, 1, 2]
            assert all(choice.text == EXPECTED for choice in reply.choices)
            assert reply.usage is not None and reply.usage.completion_tokens == 3 * 4
            assert reply.usage.prompt_tokens == len(
                stack.tiers.decode[0].reserves[-1].request.prompt_token_ids
            )
            stream = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=4,
                n=2,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            texts = ["", ""]
            for chunk in chunks:
                for choice in chunk.choices:
                    texts[choice.index] += choice.delta.content or ""
            assert texts == [EXPECTED, EXPECTED]
            roles = [
                c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role
            ]
            assert roles == ["assistant", "assistant"]  # each sample's first event carries it
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2 * 4

    asyncio.run(body())


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 3.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"n": 17}, "n"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"stop": ["a"] * 20}, "stop"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"logprobs": 2}, "logprobs"),
    ],
)
def test_bad_parameters_get_400_naming_them(
    router_stack: Any, fields: dict[str, Any], param: str
) -> None:
    async def body() -> None:
        async with router_stack() as stack, openai_client(stack) as (client, model):
            request: dict[str, Any] = {"model": model, "prompt": "Hi", **fields}
            with pytest.raises(openai.BadRequestError) as caught:
                await client.completions.create(**request)
            assert caught.value.status_code == 400
            error = caught.value.body
            assert isinstance(error, dict) and error["param"] == param, error
            assert error["message"].startswith(param)
            assert stack.tiers.decode[0].reserves == []  # refused before any tier saw it

    asyncio.run(body())


def test_chat_bad_messages_and_unknown_model(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack, openai_client(stack) as (client, model):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model=model, messages=[])
            assert isinstance(caught.value.body, dict)
            assert caught.value.body["param"] == "messages"
            too_long: Any = {"model": model, "messages": [{"role": "user", "content": "Hi"}]}
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(**too_long, max_completion_tokens=10**6)
            assert isinstance(caught.value.body, dict)
            assert caught.value.body["param"] == "max_completion_tokens"
            with pytest.raises(openai.NotFoundError) as missing:
                await client.completions.create(model="no-such-model", prompt="Hi")
            assert isinstance(missing.value.body, dict)
            assert missing.value.body["param"] == "model"

    asyncio.run(body())


def test_overload_is_429_and_no_worker_is_503(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(max_queue=1) as stack, openai_client(stack) as (client, model):
            decode = stack.tiers.decode[0]
            decode.knobs.delay_seconds = 0.1
            first = await client.completions.create(
                model=model, prompt="Hi", max_tokens=5, stream=True
            )
            async with first:
                await anext(aiter(first))
                with pytest.raises(openai.RateLimitError) as shed:
                    await client.completions.create(model=model, prompt="Hi")
                assert "--max-queue 1" in shed.value.message
            decode.knobs.delay_seconds = 0.0
            decode.knobs.load_fails = True
            await stack.registry.poll()
            with pytest.raises(openai.InternalServerError) as unavailable:
                await client.completions.create(model=model, prompt="Hi")
            assert unavailable.value.status_code == 503

    asyncio.run(body())


def test_disconnect_mid_stream_cancels_decode_and_aborts(router_stack: Any, wait_for: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack, openai_client(stack) as (client, model):
            decode = stack.tiers.decode[0]
            decode.knobs.delay_seconds = 0.2
            stream = await client.completions.create(
                model=model, prompt="Hi", max_tokens=50, stream=True
            )
            await anext(aiter(stream))
            await stream.close()  # the client goes away mid-stream
            await wait_for(lambda: len(decode.cancelled) == 1 and len(decode.aborts) == 1)
            assert decode.reservations == {}

    before = _count("/v1/completions", "CANCELLED")
    asyncio.run(body())
    assert _count("/v1/completions", "CANCELLED") == before + 1


def test_disconnect_during_prefill_cancels_prefill_and_aborts(
    router_stack: Any, wait_for: Any
) -> None:
    async def body() -> None:
        async with router_stack() as stack, openai_client(stack) as (client, model):
            prefill, decode = stack.tiers.prefill[0], stack.tiers.decode[0]
            prefill.knobs.delay_seconds = 5.0
            call = asyncio.create_task(client.completions.create(model=model, prompt="Hi"))
            await wait_for(lambda: len(prefill.calls) == 1)
            call.cancel()  # httpx closes the connection
            await wait_for(lambda: len(prefill.cancelled) == 1 and len(decode.aborts) == 1)

    asyncio.run(body())


def test_health_models_and_metrics(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack, openai_client(stack) as (client, model):
            models = await client.models.list()
            assert [card.id for card in models.data] == [model]
            await client.completions.create(model=model, prompt="Hi", max_tokens=2)
            root = str(client.base_url).removesuffix("v1/")
            assert await asyncio.to_thread(_get, root + "health") == (200, "")
            _, page = await asyncio.to_thread(_get, root + "metrics")
            assert 'pdserve_router_requests_total{code="OK",method="/v1/completions"}' in page

    asyncio.run(body())


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as page:
            return page.status, page.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


def test_the_door_is_refused_where_it_would_be_more_open_than_grpc() -> None:
    """It cannot check --tls-allowed-clients names: the router refuses to start it then."""
    named = ServerTls(Path("cert.pem"), Path("key.pem"), Path("ca.pem"), ("pdserve-router",))
    with pytest.raises(ValueError, match="--tls-allowed-clients"):
        check_http_door(8000, named)
    check_http_door(0, named)  # no door, nothing to refuse
    check_http_door(8000, ServerTls(Path("cert.pem"), Path("key.pem"), Path("ca.pem")))


def test_a_request_past_the_http_timeout_ends_504_and_frees_decode(
    router_stack: Any, wait_for: Any
) -> None:
    """OpenAI's API sends no deadline: --http-request-timeout-seconds is the router's."""

    async def body() -> None:
        async with router_stack(http_request_timeout_seconds=0.5) as stack:
            decode = stack.tiers.decode[0]
            decode.knobs.delay_seconds = 0.2  # 100 tokens: 20 s
            async with openai_client(stack) as (client, model):
                with pytest.raises(openai.APIStatusError) as caught:
                    await client.completions.create(model=model, prompt="Hi", max_tokens=100)
                assert caught.value.status_code == 504
            slow = decode.reserves[0].request.request_id
            await wait_for(lambda: slow in decode.cancelled and slow in decode.aborts)

    asyncio.run(body())
