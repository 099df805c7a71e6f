"""Sampling: seeds reproduce whatever the batch; filters and stops do what they say."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from pdserve.core.llm import LLM
from pdserve.core.outputs import CompletionOutput, FinishReason, RequestOutput
from pdserve.core.sampler import SeededNoise
from pdserve.core.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    return LLM(model_dir, num_kv_blocks=256)


SEEDED = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=1234)


def test_seeded_request_is_identical_alone_and_in_a_busy_batch(
    llm: LLM, prompts: list[list[int]]
) -> None:
    alone = _first(llm.generate(prompts[3], SEEDED)).token_ids
    busy_params = [SamplingParams(max_tokens=24, temperature=1.0) for _ in prompts]
    busy = llm.generate([*prompts, prompts[3]], [*busy_params, SEEDED])
    assert busy[-1].outputs[0].token_ids == alone
    # Unseeded neighbours really sampled (a batch of copies of greedy would prove nothing).
    assert len({out.outputs[0].token_ids for out in busy[:-1]}) > 1


def test_different_seeds_differ(llm: LLM, prompts: list[list[int]]) -> None:
    outputs = llm.generate(
        [prompts[3]] * 3,
        [SamplingParams(max_tokens=16, temperature=1.0, seed=seed) for seed in (1, 2, 3)],
    )
    assert len({out.outputs[0].token_ids for out in outputs}) > 1


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=12, temperature=1.0, top_k=1, seed=7),
        SamplingParams(max_tokens=12, temperature=1.0, top_p=1e-6, seed=7),
    ],
    ids=["top_k=1", "tiny top_p"],
)
def test_filters_that_leave_one_token_are_greedy(
    llm: LLM, prompts: list[list[int]], params: SamplingParams
) -> None:
    greedy = _first(llm.generate(prompts[2], SamplingParams(max_tokens=12, temperature=0)))
    assert _first(llm.generate(prompts[2], params)).token_ids == greedy.token_ids


def test_stop_string_ends_the_text_before_it(llm: LLM, tokenizer: Any) -> None:
    free = llm.generate("The capital of France is", SamplingParams(max_tokens=20, temperature=0))
    text = _first(free).text
    stop = text[4:7]  # a stop string that the greedy text really contains
    stopped = _first(
        llm.generate(
            "The capital of France is", SamplingParams(max_tokens=20, temperature=0, stop=(stop,))
        )
    )
    assert stopped.finish_reason is FinishReason.STOP
    assert stopped.text == text[: text.index(stop)]
    assert stop not in stopped.text


def test_stop_token_is_returned_and_ends_the_request(llm: LLM) -> None:
    free = _first(
        llm.generate("The capital of France is", SamplingParams(max_tokens=10, temperature=0))
    )
    stop_token = free.token_ids[3]
    stopped = _first(
        llm.generate(
            "The capital of France is",
            SamplingParams(max_tokens=10, temperature=0, stop_token_ids=(stop_token,)),
        )
    )
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(stop_token) + 1]
    assert stopped.finish_reason is FinishReason.STOP


def test_ignore_eos_runs_to_max_tokens(llm: LLM) -> None:
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    out = _first(llm.generate("Hi", params))
    assert len(out.token_ids) == 40 and out.finish_reason is FinishReason.LENGTH
    assert out.finish_reason == "length"  # a str, as vLLM's finish_reason


def _first(outputs: list[RequestOutput]) -> CompletionOutput:
    """The only sample of the only prompt."""
    (output,) = outputs
    (sample,) = output.outputs
    return sample


def test_seeded_noise_starts_anywhere_at_once() -> None:
    """A resumed stream's noise starts at its token count without replaying the draws before
    (one generator replayed them: ~10^9 draws for an 8k-token stream on a 128k vocabulary)."""
    walked = SeededNoise(seed=5)
    draws = [walked.draw(1000) for _ in range(4)]
    assert torch.equal(SeededNoise(seed=5, index=3).draw(1000), draws[3])
    assert not torch.equal(SeededNoise(seed=6, index=3).draw(1000), draws[3])
    assert not torch.equal(SeededNoise(seed=5, index=4).draw(1000), draws[3])
    far = time.perf_counter()
    SeededNoise(seed=5, index=10**9).draw(128_000)
    assert time.perf_counter() - far < 1.0  # replaying 10^9 vocabulary-sized draws: hours
