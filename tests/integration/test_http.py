"""The OpenAI HTTP door against real tiers (router + 2 prefill + 2 decode, UCX, the real model),
driven by the official `openai` client: the same greedy text as gRPC, chat as `pdserve generate
--chat` renders it, stream usage, a mid-stream disconnect freeing every block, 400s naming the
parameter.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster

from .helpers import wait_all_blocks_free

pytestmark = pytest.mark.integration

PROMPT = "The capital of France is"
MAX_TOKENS = 12


@pytest.fixture
def client(cluster: Cluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=cluster.http_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _grpc_text(cluster: Cluster) -> str:
    async def generate() -> str:
        sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
        async with GenerationClient.connect(cluster.router.address) as grpc_client:
            reply = await grpc_client.generate(build_request(PROMPT, sampling=sampling))
            return str(reply.text)

    return asyncio.run(generate())


def test_completions_greedy_text_equals_the_grpc_path(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    model = _model(client)
    expected = _grpc_text(cluster)
    reply = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0
    )
    assert reply.choices[0].text == expected
    assert reply.usage is not None and reply.usage.completion_tokens <= MAX_TOKENS
    stream = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].usage == reply.usage
    wait_all_blocks_free(cluster)


def test_chat_matches_generate_chat_cli(cluster: Cluster, client: openai.OpenAI) -> None:
    question = "What is the capital of France?"
    command = [
        sys.executable,
        "-m",
        "pdserve",
        "generate",
        "--chat",
        question,
        "--address",
        cluster.router.address,
        "--model",
        str(cluster.spec.model_dir),
        "--max-tokens",
        str(MAX_TOKENS),
    ]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    messages: Any = [{"role": "user", "content": question}]
    reply = client.chat.completions.create(
        model=_model(client), messages=messages, max_tokens=MAX_TOKENS, temperature=0.0
    )
    text = reply.choices[0].message.content
    assert text and printed.stdout == text + "\n"
    stream = client.chat.completions.create(
        model=_model(client),
        messages=messages,
        max_completion_tokens=MAX_TOKENS,
        temperature=0.0,
        stream=True,
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == text


def test_disconnect_mid_stream_frees_blocks_on_both_tiers(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    stream = client.completions.create(
        model=_model(client),
        prompt=PROMPT,
        max_tokens=200,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    first = next(iter(stream))
    assert first.choices[0].text is not None
    stream.close()  # the client goes away with ~200 tokens still to come
    wait_all_blocks_free(cluster)


def test_n_samples_equal_the_grpc_samples(cluster: Cluster, client: openai.OpenAI) -> None:
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_k=50, seed=7, n=3)

    async def grpc_samples() -> list[str]:
        async with GenerationClient.connect(cluster.router.address) as grpc_client:
            reply = await grpc_client.generate(build_request(PROMPT, sampling=sampling))
            return [sample.text for sample in reply.samples]

    expected = asyncio.run(grpc_samples())
    request: dict[str, Any] = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.9}
    request.update(model=_model(client), seed=7, n=3, extra_body={"top_k": 50})
    reply = client.completions.create(**request)
    assert [choice.text for choice in reply.choices] == expected
    streamed = ["", "", ""]
    for chunk in client.completions.create(**request, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == expected
    wait_all_blocks_free(cluster)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"n": 17}, "n"),
        ({"prompt": ""}, "prompt"),
    ],
)
def test_bad_parameters_get_400_naming_them(
    cluster: Cluster, client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    request: dict[str, Any] = {"model": _model(client), "prompt": PROMPT, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**request)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param
    wait_all_blocks_free(cluster)
