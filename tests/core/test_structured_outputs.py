"""Structured outputs through `pdserve.LLM`: greedy output under a constraint equals transformers'
`generate` under the same library's logits processor, on every scheduling path (swap, recompute,
chunked prefill, speculation, resumption); every output validates; bad constraints are refused
naming the field, before anything is scheduled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.structured.params import StructuredOutputsParams
from tests.core.test_greedy_matches_hf import assert_engine_empty, assert_scenario_ran
from tests.structured_cases import CASES, MAX_TOKENS, SHORT, assert_follows

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

SCENARIOS = {
    "roomy": EngineConfig(num_kv_blocks=256),
    "swap": EngineConfig(num_kv_blocks=14, num_swap_blocks=64),
    "recompute": EngineConfig(num_kv_blocks=14, num_swap_blocks=0),
    "chunked": EngineConfig(num_kv_blocks=256, max_num_batched_tokens=16),
}


def greedy(structured: StructuredOutputsParams, **overrides: Any) -> SamplingParams:
    return SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0, structured_outputs=structured, **overrides
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_under_a_constraint_equals_transformers(
    scenario: str,
    model_dir: Path,
    structured_prompts: list[list[int]],
    structured_reference: list[list[int]],
) -> None:
    llm = LLM(model_dir, **vars(SCENARIOS[scenario]))
    outputs = llm.generate(structured_prompts, [greedy(structured) for _, structured in CASES])

    assert [list(out.outputs[0].token_ids) for out in outputs] == structured_reference
    for out, (_, structured) in zip(outputs, CASES, strict=True):
        assert out.outputs[0].finish_reason == "stop"
        assert_follows(out.outputs[0].text, structured)
    assert_scenario_ran(llm, scenario)
    assert_engine_empty(llm)


def test_free_and_constrained_requests_share_steps(
    model_dir: Path,
    structured_prompts: list[list[int]],
    structured_reference: list[list[int]],
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    """Only the constrained rows of a step are masked: the free ones give transformers' own."""
    llm = LLM(model_dir, num_kv_blocks=256)
    free = SamplingParams(max_tokens=max_new_tokens, temperature=0)
    outputs = llm.generate(
        structured_prompts + prompts[:4], [greedy(s) for _, s in CASES] + [free] * 4
    )

    tokens = [list(out.outputs[0].token_ids) for out in outputs]
    assert tokens == structured_reference + hf_greedy[:4]
    assert_engine_empty(llm)


def test_drafts_are_cut_by_the_grammar_and_change_nothing(
    model_dir: Path, structured_prompts: list[list[int]], structured_reference: list[list[int]]
) -> None:
    llm = LLM(model_dir, num_kv_blocks=256, speculative="ngram", num_speculative_tokens=4)
    outputs = llm.generate(structured_prompts, [greedy(structured) for _, structured in CASES])

    assert [list(out.outputs[0].token_ids) for out in outputs] == structured_reference
    stats = llm.engine.stats()
    assert 0 < stats.num_accepted_tokens <= stats.num_drafted_tokens
    assert_engine_empty(llm)


def test_every_sample_follows_the_constraint(
    model_dir: Path, structured_prompts: list[list[int]]
) -> None:
    """n = 3 forks of one prompt: one matcher each."""
    llm = LLM(model_dir, num_kv_blocks=256)
    params = [
        SamplingParams(
            max_tokens=MAX_TOKENS, temperature=1.0, seed=7, n=3, structured_outputs=structured
        )
        for _, structured in CASES[SHORT]
    ]
    outputs = llm.generate(structured_prompts[SHORT], params)

    for out, (_, structured) in zip(outputs, CASES[SHORT], strict=True):
        assert len({sample.token_ids for sample in out.outputs}) > 1 or structured.choice
        for sample in out.outputs:
            assert_follows(sample.text, structured)
    assert_engine_empty(llm)


def test_a_resumed_request_continues_its_grammar(
    model_dir: Path, structured_prompts: list[list[int]], structured_reference: list[list[int]]
) -> None:
    """A migration's resumption: the matcher catches up on the output streamed elsewhere."""
    engine = LLM(model_dir, num_kv_blocks=256).engine
    cut = 5
    engine.add_request(
        structured_prompts[0],
        greedy(CASES[0][1]),
        "resumed",
        resumed_output=structured_reference[0][:cut],
    )
    tokens: list[int] = []
    while engine.has_unfinished():
        for delta in engine.step():
            tokens.extend(delta.new_token_ids)

    assert structured_reference[0][:cut] + tokens == structured_reference[0]


def test_resumed_output_the_grammar_refuses_is_invalid(
    model_dir: Path, structured_prompts: list[list[int]], tokenizer: Any
) -> None:
    engine = LLM(model_dir, num_kv_blocks=256).engine
    not_json = list(tokenizer.encode("hello", add_special_tokens=False))

    with pytest.raises(InvalidRequestError) as refused:
        engine.add_request(structured_prompts[0], greedy(CASES[0][1]), resumed_output=not_json)

    assert refused.value.field == "resumed_output_token_ids"
    assert not engine.requests and not engine.has_unfinished()


@pytest.mark.parametrize(
    ("structured", "field"),
    [
        (StructuredOutputsParams(json='{"type": "nonsense"}'), "sampling.structured.json"),
        (StructuredOutputsParams(regex="(["), "sampling.structured.regex"),
        (StructuredOutputsParams(grammar="root ::= undefined_rule"), "sampling.structured.grammar"),
    ],
)
def test_a_constraint_that_does_not_compile_is_refused_before_scheduling(
    model_dir: Path,
    structured_prompts: list[list[int]],
    structured: StructuredOutputsParams,
    field: str,
) -> None:
    engine = LLM(model_dir, num_kv_blocks=256).engine

    with pytest.raises(InvalidRequestError) as refused:
        engine.add_request(structured_prompts[0], greedy(structured))

    assert refused.value.field == field
    assert "does not compile" in str(refused.value)
    assert not engine.requests and not engine.has_unfinished()
