"""Speculative decoding through real processes: router -> prefill -> UCX -> decode drafting with
`--speculative ngram`, and colocated (decode prefills itself). Greedy tokens are transformers'
on both doors (gRPC unary and stream, OpenAI HTTP), and under structured-output constraints
transformers' under the same mask, the decode worker reports drafts verified and kept, and
every block is free afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster
from tests.oracle import transformers_greedy

from .conftest import start_cluster
from .helpers import (
    assert_every_case_as_transformers,
    greedy_outputs,
    metric,
    wait_all_blocks_free,
)

pytestmark = pytest.mark.integration

SPECULATIVE = ("--speculative", "ngram", "--num-speculative-tokens", "4")
# Answers that repeat their prompt: what n-gram drafts are for.
HTTP_PROMPT = "one two three four five six seven eight. one two three four five six seven eight."


@pytest.fixture(scope="module")
def spec_cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("spec-logs")
    cluster = start_cluster(model_dir, logs, 1, 1, decode_args=SPECULATIVE)
    yield cluster
    cluster.stop()


def assert_drafts_kept(cluster: Cluster) -> None:
    decode = cluster.decode[0]
    drafted = metric(decode, "pdserve_decode_spec_drafted_tokens")
    accepted = metric(decode, "pdserve_decode_spec_accepted_tokens")
    assert 0 < accepted <= drafted
    assert metric(decode, "pdserve_decode_spec_acceptance_rate") == pytest.approx(
        accepted / drafted
    )


async def _stream_all(
    cluster: Cluster, prompts: list[list[int]], max_tokens: int
) -> list[list[int]]:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)

    async def one(client: GenerationClient, prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        async for chunk in client.generate_stream(build_request(prompt, sampling=sampling)):
            tokens.extend(chunk.token_ids)
        return tokens

    async with GenerationClient.connect(cluster.router.address) as client:
        return list(await asyncio.gather(*(one(client, prompt) for prompt in prompts)))


def test_disaggregated_greedy_with_drafts_equals_transformers(
    spec_cluster: Cluster,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    assert asyncio.run(greedy_outputs(spec_cluster, prompts, max_new_tokens)) == hf_greedy
    assert asyncio.run(_stream_all(spec_cluster, prompts, max_new_tokens)) == hf_greedy
    assert_drafts_kept(spec_cluster)
    wait_all_blocks_free(spec_cluster)


def test_constrained_drafts_give_transformers_tokens_under_the_mask(
    spec_cluster: Cluster,
    structured_prompts: list[list[int]],
    structured_reference: list[list[int]],
) -> None:
    """Decode cuts each draft where the grammar refuses it and masks every verified row."""
    drafted = "pdserve_decode_spec_drafted_tokens"
    drafted_before = metric(spec_cluster.decode[0], drafted)
    assert_every_case_as_transformers(spec_cluster, structured_prompts, structured_reference)
    assert metric(spec_cluster.decode[0], drafted) > drafted_before  # the record was drafted
    wait_all_blocks_free(spec_cluster)


def test_http_greedy_with_drafts_equals_transformers(
    spec_cluster: Cluster, model_dir: Path, tokenizer: Any
) -> None:
    ids = tokenizer.encode(HTTP_PROMPT)
    expected_ids = transformers_greedy(model_dir, [ids], 24)[0]
    expected = tokenizer.decode(expected_ids, skip_special_tokens=True)
    base_url = spec_cluster.http_url + "/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        model = client.models.list().data[0].id
        reply = client.completions.create(
            model=model, prompt=HTTP_PROMPT, max_tokens=24, temperature=0.0
        )
    assert reply.choices[0].text == expected
    wait_all_blocks_free(spec_cluster)


def test_colocated_greedy_with_drafts_equals_transformers(
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    """No prefill tier: the decode worker prefills and drafts itself."""
    cluster = start_cluster(
        model_dir, tmp_path_factory.mktemp("spec-colocated-logs"), 0, 1, decode_args=SPECULATIVE
    )
    try:
        assert asyncio.run(greedy_outputs(cluster, prompts, max_new_tokens)) == hf_greedy
        assert_drafts_kept(cluster)
        wait_all_blocks_free(cluster)
    finally:
        cluster.stop()
