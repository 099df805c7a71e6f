"""Structured outputs through the split (router -> prefill -> UCX -> decode, real processes): greedy
output under every kind of constraint equals transformers' under the same mask, n samples each
follow theirs, the OpenAI door's `response_format` and `structured_outputs` give what the gRPC
door gives, constraints that do not compile are refused naming the field at both doors with
nothing held, and a grammar that takes seconds to compile never stalls the other streams.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import openai
import pytest

from pdserve.bench.offline.structured_workload import WORKLOAD_DIR
from pdserve.cli import main
from pdserve.client import GenerationClient, build_request
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.serving.sampling_proto import sampling_to_proto
from pdserve.core.structured.params import StructuredOutputsParams
from pdserve.local.cluster import Cluster
from pdserve.v1 import generation_pb2
from tests.structured_cases import CASES, MAX_TOKENS, PERSON, SHORT, assert_follows

from .helpers import (
    assert_every_case_as_transformers,
    generate_all,
    metric,
    structured_request,
    wait_all_blocks_free,
)

pytestmark = pytest.mark.integration

# Constraints hard on a grammar engine, each new to the workers: long counted repetitions, a
# 3000-value enum, 40 alternative objects, an 800-rule grammar whose lexer blows up.
HARD_CONSTRAINTS = (
    StructuredOutputsParams(
        json={"type": "string", "pattern": "^([a-z]{2,40}-[0-9]{1,30}\\.){60}$"}
    ),
    StructuredOutputsParams(regex="(a|b|cd|efg){500,2000}x"),
    StructuredOutputsParams(json={"enum": [f"value-{i}-{i * 7919 % 10007}" for i in range(3000)]}),
    StructuredOutputsParams(
        json={
            "anyOf": [
                {
                    "type": "object",
                    "properties": {f"k{i}_{j}": {"type": "string"} for j in range(20)},
                    "required": [f"k{i}_{j}" for j in range(20)],
                }
                for i in range(40)
            ]
        }
    ),
    StructuredOutputsParams(
        grammar="start: "
        + " | ".join(f'"w{i}" x{i}' for i in range(800))
        + "\n"
        + "\n".join(f'x{i}: "a"{{{i % 50 + 1}}}' for i in range(800))
    ),
)
STEADY_GAP_S = 1.0  # a decode step takes ~0.1 s here


@pytest.fixture
def client(cluster: Cluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=cluster.http_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_greedy_through_the_split_equals_transformers_under_the_mask(
    cluster: Cluster,
    structured_prompts: list[list[int]],
    structured_reference: list[list[int]],
) -> None:
    assert_every_case_as_transformers(cluster, structured_prompts, structured_reference)
    # Prefill masked every first token, decode the rest.
    masked = "pdserve_{}_structured_masked_rows_total"
    assert sum(metric(p, masked.format("prefill")) for p in cluster.prefill) >= len(CASES)
    assert sum(metric(p, masked.format("decode")) for p in cluster.decode) >= len(CASES)
    wait_all_blocks_free(cluster)


def test_every_sample_follows_its_constraint(
    cluster: Cluster, structured_prompts: list[list[int]]
) -> None:
    """n = 3 fan out at the router: each sample's matcher on its own worker."""
    requests = [
        structured_request(prompt, structured, temperature=1.0, seed=11, n=3)
        for prompt, (_, structured) in zip(structured_prompts[SHORT], CASES[SHORT], strict=True)
    ]
    replies = asyncio.run(generate_all(cluster, requests))

    for reply, (_, structured) in zip(replies, CASES[SHORT], strict=True):
        assert len(reply.samples) == 3
        for sample in reply.samples:
            assert_follows(sample.text, structured)
    wait_all_blocks_free(cluster)


def test_openai_response_formats_follow_and_match_grpc(
    cluster: Cluster, client: openai.OpenAI, structured_prompts: list[list[int]]
) -> None:
    model = client.models.list().data[0].id
    question, structured = CASES[1]  # a schema, and no record in the prompt to copy
    (grpc_reply,) = asyncio.run(
        generate_all(cluster, [structured_request(structured_prompts[1], structured)])
    )
    messages: Any = [{"role": "user", "content": question}]
    schema_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    chat = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        response_format=schema_format,
    )
    text = chat.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), PERSON)
    assert text == grpc_reply.text
    streamed = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        response_format=schema_format,
        stream=True,
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == text

    any_object = client.completions.create(
        model=model,
        prompt="A JSON object describing a cat:",
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    if any_object.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(any_object.choices[0].text), dict)
    phone = client.completions.create(
        model=model,
        prompt="The museum's phone number is",
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        extra_body={"structured_outputs": {"regex": CASES[2][1].regex}},
    )
    assert_follows(phone.choices[0].text, CASES[2][1])
    wait_all_blocks_free(cluster)


@pytest.mark.parametrize(
    ("structured", "field"),
    [
        (StructuredOutputsParams(json='{"type": "nonsense"}'), "sampling.structured.json"),
        (StructuredOutputsParams(regex="(["), "sampling.structured.regex"),
        (StructuredOutputsParams(grammar="root ::= missing"), "sampling.structured.grammar"),
    ],
)
def test_a_constraint_that_does_not_compile_is_invalid_at_the_grpc_door(
    cluster: Cluster,
    structured_prompts: list[list[int]],
    structured: StructuredOutputsParams,
    field: str,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(generate_all(cluster, [structured_request(structured_prompts[0], structured)]))

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith(f"{field}: does not compile")
    wait_all_blocks_free(cluster)


def test_a_schema_that_is_not_json_is_invalid_at_the_grpc_door(
    cluster: Cluster, structured_prompts: list[list[int]]
) -> None:
    request = structured_request(structured_prompts[0], StructuredOutputsParams(json="{}"))
    request.sampling.structured.json = "{not json"

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(generate_all(cluster, [request]))

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith("sampling.structured.json: is not JSON")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "(["}}, "structured_outputs.regex"),
    ],
)
def test_bad_constraints_get_400_naming_them(
    cluster: Cluster, client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(
            model=client.models.list().data[0].id,
            prompt="Hello",
            max_tokens=8,
            extra_body=fields,
        )

    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == param
    wait_all_blocks_free(cluster)


def test_hard_constraints_never_stall_the_other_streams(
    cluster: Cluster, structured_prompts: list[list[int]]
) -> None:
    """While constraints hard to build and to mask run (compiled on the workers' compile
    threads, masked step by step), a stream on the same workers keeps its pace; each hard
    request ends, with its tokens or an error, and nothing stays held."""
    steady = build_request(
        structured_prompts[3],
        sampling=sampling_to_proto(SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)),
    )
    hard = [
        structured_request(structured_prompts[1], structured, max_tokens=24)
        for structured in HARD_CONSTRAINTS
    ]

    async def run() -> tuple[list[float], float, float, list[object]]:
        arrivals: list[float] = []
        async with GenerationClient.connect(cluster.router.address) as grpc_client:

            async def stream_steady() -> None:
                async for _ in grpc_client.generate_stream(steady, timeout=120):
                    arrivals.append(time.monotonic())

            streaming = asyncio.ensure_future(stream_steady())
            while len(arrivals) < 5:
                await asyncio.sleep(0.01)
            sent = time.monotonic()
            outcomes = await asyncio.gather(
                *(grpc_client.generate(request, timeout=120) for request in hard),
                return_exceptions=True,
            )
            answered = time.monotonic()
            await streaming
        return arrivals, sent, answered, list(outcomes)

    arrivals, sent, answered, outcomes = asyncio.run(run())

    for outcome in outcomes:  # tokens, or a refusal that says why
        if isinstance(outcome, grpc.aio.AioRpcError):
            assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT, outcome
        else:
            assert isinstance(outcome, generation_pb2.GenerateResponse) and outcome.token_ids
    during = [b - a for a, b in itertools.pairwise(arrivals) if sent <= b <= answered]
    assert during and max(during) < STEADY_GAP_S, during
    wait_all_blocks_free(cluster)


def test_the_structured_bench_runs_through_the_cluster(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pdserve bench structured --router`: both modes through the split, the same tokens."""
    workload = tmp_path / "two.json"
    shipped = json.loads((WORKLOAD_DIR / "structured.json").read_text())
    workload.write_text(json.dumps([{**request, "max_tokens": 12} for request in shipped[:2]]))
    argv = ["bench", "structured", "--router", cluster.router.address, "--workload", str(workload)]

    assert main([*argv, "--repeats", "1", "--batch1", "--json"]) == 0

    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    modes = [(row["mode"], row["slots"]) for row in rows if "mode" in row]
    assert modes == [("off", 0), ("json_schema", 0), ("off", 1), ("json_schema", 1)]
    for row in rows:
        if row.get("mode") == "json_schema":
            assert row["invalid"] == 0 and row["valid"] + row["truncated"] == 2
        if "mode" in row:
            assert row["output_tokens"] == rows[1]["output_tokens"] > 0
            assert row["steps"] is None and row["mask_ms_per_step"] is None
    wait_all_blocks_free(cluster)
