"""Structured outputs through `pdserve.LLM`: greedy output under a constraint equals transformers'
`generate` under the same library's logits processor, on every scheduling path (swap, recompute,
chunked prefill, speculation, resumption); every output validates; bad constraints are refused
naming the field, before anything is scheduled.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.structured.grammar import Grammars
from pdserve.core.structured.params import StructuredOutputsParams
from tests.conftest import transformers_greedy
from tests.core.test_greedy_matches_hf import assert_engine_empty, assert_scenario_ran

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

MAX_TOKENS = 64
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
COLORS = ("red", "green", "blue")
YES_NO = 'root ::= ("yes" | "no") "." '

# (question, constraint): every kind of constraint, the first asked to repeat a record, so that
# n-gram drafts find matches in its prompt.
CASES: list[tuple[str, StructuredOutputsParams]] = [
    (
        'A record: {"name": "Ada Lovelace", "age": 36, "languages": ["English", "French"]}. '
        "Repeat the record exactly, as JSON.",
        StructuredOutputsParams(json=PERSON),
    ),
    ("Describe a famous scientist as JSON.", StructuredOutputsParams(json=PERSON)),
    ("What is the phone number of the museum?", StructuredOutputsParams(regex=PHONE)),
    ("What color is the sky?", StructuredOutputsParams(choice=COLORS)),
    ("Is water wet?", StructuredOutputsParams(grammar=YES_NO)),
    (
        "Reply with a JSON object with one key, sound, for the sound a cat makes.",
        StructuredOutputsParams(json_object=True),
    ),
]

SCENARIOS = {
    "roomy": EngineConfig(num_kv_blocks=256),
    "swap": EngineConfig(num_kv_blocks=14, num_swap_blocks=64),
    "recompute": EngineConfig(num_kv_blocks=14, num_swap_blocks=0),
    "chunked": EngineConfig(num_kv_blocks=256, max_num_batched_tokens=16),
}


def chat_prompt(tokenizer: Any, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text))


def assert_follows(text: str, structured: StructuredOutputsParams) -> None:
    """The output is what its constraint describes."""
    if structured.json is not None:
        jsonschema.validate(json.loads(text), json.loads(str(structured.json)))
    elif structured.json_object:
        assert isinstance(json.loads(text), dict)
    elif structured.regex is not None:
        assert re.fullmatch(structured.regex, text), text
    elif structured.choice is not None:
        assert text in structured.choice
    else:
        assert text in ("yes.", "no."), text


@pytest.fixture(scope="module")
def grammars(tokenizer: Any, model_dir: Path) -> Grammars:
    """The engine's own compiler, for the reference's logits processor."""
    from pdserve.core.model.config import load_model_config

    config = load_model_config(model_dir)
    return Grammars(tokenizer, config.vocab_size, config.eos_token_ids)


@pytest.fixture(scope="module")
def case_prompts(tokenizer: Any) -> list[list[int]]:
    return [chat_prompt(tokenizer, question) for question, _ in CASES]


@pytest.fixture(scope="module")
def reference(
    model_dir: Path, case_prompts: list[list[int]], grammars: Grammars
) -> list[list[int]]:
    """transformers' greedy tokens under xgrammar's own logits processor, one prompt at a time."""
    from xgrammar.contrib.hf import LogitsProcessor

    def processors(index: int) -> list[Any]:
        return [LogitsProcessor(grammars.compiled(CASES[index][1]))]

    return transformers_greedy(model_dir, case_prompts, MAX_TOKENS, processors)


def greedy(structured: StructuredOutputsParams, **overrides: Any) -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0, structured=structured, **overrides)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_under_a_constraint_equals_transformers(
    scenario: str, model_dir: Path, case_prompts: list[list[int]], reference: list[list[int]]
) -> None:
    llm = LLM(model_dir, **vars(SCENARIOS[scenario]))
    outputs = llm.generate(case_prompts, [greedy(structured) for _, structured in CASES])

    assert [list(out.outputs[0].token_ids) for out in outputs] == reference
    for out, (_, structured) in zip(outputs, CASES, strict=True):
        assert out.outputs[0].finish_reason == "stop"
        assert_follows(out.outputs[0].text, structured)
    assert_scenario_ran(llm, scenario)
    assert_engine_empty(llm)


def test_drafts_are_cut_by_the_grammar_and_change_nothing(
    model_dir: Path, case_prompts: list[list[int]], reference: list[list[int]]
) -> None:
    llm = LLM(model_dir, num_kv_blocks=256, speculative="ngram", num_speculative_tokens=4)
    outputs = llm.generate(case_prompts, [greedy(structured) for _, structured in CASES])

    assert [list(out.outputs[0].token_ids) for out in outputs] == reference
    stats = llm.engine.stats()
    assert 0 < stats.num_accepted_tokens <= stats.num_drafted_tokens
    assert_engine_empty(llm)


def test_every_sample_follows_the_constraint(
    model_dir: Path, case_prompts: list[list[int]]
) -> None:
    """n = 3 forks of one prompt: one matcher each."""
    llm = LLM(model_dir, num_kv_blocks=256)
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=7, n=3, structured=structured)
        for _, structured in CASES[2:]  # the short ones: a sampled JSON may run past max_tokens
    ]
    outputs = llm.generate(case_prompts[2:], params)

    for out, (_, structured) in zip(outputs, CASES[2:], strict=True):
        assert len({sample.token_ids for sample in out.outputs}) > 1 or structured.choice
        for sample in out.outputs:
            assert_follows(sample.text, structured)
    assert_engine_empty(llm)


def test_a_resumed_request_continues_its_grammar(
    model_dir: Path, case_prompts: list[list[int]], reference: list[list[int]]
) -> None:
    """A migration's resumption: the matcher catches up on the output streamed elsewhere."""
    engine = LLM(model_dir, num_kv_blocks=256).engine
    cut = 5
    engine.add_request(
        case_prompts[0], greedy(CASES[0][1]), "resumed", resumed_output=reference[0][:cut]
    )
    tokens: list[int] = []
    while engine.has_unfinished():
        for delta in engine.step():
            tokens.extend(delta.new_token_ids)

    assert reference[0][:cut] + tokens == reference[0]


def test_resumed_output_the_grammar_refuses_is_invalid(
    model_dir: Path, case_prompts: list[list[int]], tokenizer: Any
) -> None:
    engine = LLM(model_dir, num_kv_blocks=256).engine
    not_json = list(tokenizer.encode("hello", add_special_tokens=False))

    with pytest.raises(InvalidRequestError) as refused:
        engine.add_request(case_prompts[0], greedy(CASES[0][1]), resumed_output=not_json)

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
    model_dir: Path, case_prompts: list[list[int]], structured: StructuredOutputsParams, field: str
) -> None:
    engine = LLM(model_dir, num_kv_blocks=256).engine

    with pytest.raises(InvalidRequestError) as refused:
        engine.add_request(case_prompts[0], greedy(structured))

    assert refused.value.field == field
    assert "does not compile" in str(refused.value)
    assert not engine.requests and not engine.has_unfinished()
