"""Greedy output is the oracle: every scheduling path must give transformers' tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

SCENARIOS = {
    "roomy": EngineConfig(num_kv_blocks=256),
    # Too few blocks for all eight at once: running requests get swapped out to the CPU pool.
    "swap": EngineConfig(num_kv_blocks=40, num_swap_blocks=128),
    # Same pressure without swap space: preempted requests are recomputed from scratch.
    "recompute": EngineConfig(num_kv_blocks=40, num_swap_blocks=0),
    # A 64-token budget forces long prompts to be prefilled in chunks across steps.
    "chunked": EngineConfig(num_kv_blocks=256, max_num_batched_tokens=64),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_equals_transformers(
    scenario: str,
    model_dir: Path,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    config = SCENARIOS[scenario]
    llm = LLM(model_dir, **vars(config))
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_new_tokens, temperature=0))

    assert [list(out.outputs[0].token_ids) for out in outputs] == hf_greedy
    assert_scenario_ran(llm, scenario)
    assert_engine_empty(llm)


def test_text_is_the_decoded_tokens(
    model_dir: Path, prompts: list[list[int]], tokenizer: Any
) -> None:
    llm = LLM(model_dir, num_kv_blocks=128)
    for out in llm.generate(prompts[:3], SamplingParams(max_tokens=16, temperature=0)):
        sample = out.outputs[0]
        assert sample.text == tokenizer.decode(list(sample.token_ids), skip_special_tokens=True)


def test_an_output_per_prompt_carries_its_prompt(
    model_dir: Path, prompts: list[list[int]], tokenizer: Any
) -> None:
    """vLLM's shape: one RequestOutput per prompt, in order, with the prompt as given (text, or
    None for token ids) and its token ids."""
    llm = LLM(model_dir, num_kv_blocks=128)
    text = "The capital of France is"
    outputs = llm.generate([text, prompts[2]], SamplingParams(max_tokens=4, temperature=0))
    assert [out.prompt for out in outputs] == [text, None]
    assert [list(out.prompt_token_ids) for out in outputs] == [tokenizer.encode(text), prompts[2]]
    assert all(out.finished and len(out.outputs) == 1 for out in outputs)
    assert [out.outputs[0].index for out in outputs] == [0, 0]
    assert len({out.request_id for out in outputs}) == 2


def assert_scenario_ran(llm: LLM, scenario: str) -> None:
    """The pool was as small as the scenario says: "swap" swapped out, "recompute" preempted
    without swapping (a roomy run proves nothing about those paths)."""
    scheduler = llm.engine.scheduler
    if scenario == "swap":
        assert scheduler.num_swaps_out > 0
    if scenario == "recompute":
        assert scheduler.num_preemptions > 0 and scheduler.num_swaps_out == 0


def assert_engine_empty(llm: LLM) -> None:
    """Nothing leaked: every block free, swap pool empty, no request left in any queue."""
    engine = llm.engine
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_free_swap_blocks == engine.config.num_swap_blocks
    assert (stats.num_waiting, stats.num_running, stats.num_swapped) == (0, 0, 0)
    assert not engine.requests
