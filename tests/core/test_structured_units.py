"""The structured-output parts on their own: what StructuredOutputsParams accepts, the proto round
trip, the compiler's cache and time bound, the matcher's bookkeeping (advance, roll back, catch up),
and the bitmask applied to the logits."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pdserve.core.model.config import load_model_config
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.serving.sampling_proto import sampling_from_proto, sampling_to_proto
from pdserve.core.structured.grammar import Grammars, apply_bitmask
from pdserve.core.structured.params import (
    MAX_CHOICES,
    MAX_CONSTRAINT_CHARS,
    StructuredOutputsParams,
)


@pytest.fixture(scope="module")
def grammars(tokenizer: Any, model_dir: Path) -> Grammars:
    config = load_model_config(model_dir)
    return Grammars(tokenizer, config.vocab_size, config.eos_token_ids)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({}, "structured"),
        ({"json": "{}", "regex": "a"}, "structured"),
        ({"json": "{not json"}, "structured.json"),
        ({"json": "[1, 2]"}, "structured.json"),
        ({"regex": "  "}, "structured.regex"),
        ({"grammar": ""}, "structured.grammar"),
        ({"choice": ()}, "structured.choice"),
        ({"choice": ("a", "")}, "structured.choice"),
        ({"choice": tuple("x" * (i + 1) for i in range(MAX_CHOICES + 1))}, "structured.choice"),
        ({"regex": "a" * (MAX_CONSTRAINT_CHARS + 1)}, "structured.regex"),
    ],
)
def test_bad_constraints_name_their_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        StructuredOutputsParams(**fields)
    assert refused.value.field == field


def test_a_schema_given_as_a_dict_becomes_its_text_in_order() -> None:
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    assert (
        StructuredOutputsParams(json=schema).json
        == '{"type": "object", "properties": {"b": {}, "a": {}}}'
    )
    assert StructuredOutputsParams(choice=["x", "y"]).choice == ("x", "y")


@pytest.mark.parametrize(
    "structured",
    [
        StructuredOutputsParams(json='{"type": "integer"}'),
        StructuredOutputsParams(json_object=True),
        StructuredOutputsParams(regex="[0-9]+"),
        StructuredOutputsParams(grammar='root ::= "a"'),
        StructuredOutputsParams(choice=("yes", "no")),
    ],
)
def test_every_kind_survives_the_wire(structured: StructuredOutputsParams) -> None:
    params = SamplingParams(structured_outputs=structured)
    assert sampling_from_proto(sampling_to_proto(params), 0) == params


def test_a_compile_past_its_bound_is_refused_and_cached_once_done(
    tokenizer: Any, model_dir: Path
) -> None:
    """A fresh worker's first compile also reads the tokenizer (~0.5 s): past a 50 ms bound."""
    config = load_model_config(model_dir)
    grammars = Grammars(tokenizer, config.vocab_size, config.eos_token_ids, compile_timeout_s=0.05)
    schema = StructuredOutputsParams(json='{"type": "integer"}')

    with pytest.raises(InvalidRequestError) as refused:
        asyncio.run(grammars.prepare(schema))
    assert refused.value.field == "sampling.structured.json"
    assert "did not compile within 0.05 s" in str(refused.value)

    grammars.state_for(schema)  # waits for the compile that went on
    started = time.monotonic()
    asyncio.run(grammars.prepare(schema))
    assert time.monotonic() - started < 0.05 and grammars.num_compiles == 1


def test_the_same_constraint_compiles_once(grammars: Grammars) -> None:
    before = grammars.num_compiles
    for _ in range(3):
        asyncio.run(grammars.prepare(StructuredOutputsParams(regex="[a-c]{2}")))
    assert grammars.num_compiles == before + 1


def test_the_matcher_advances_rolls_back_and_catches_up(grammars: Grammars, tokenizer: Any) -> None:
    state = grammars.state_for(StructuredOutputsParams(choice=("apple pie", "banana")))
    apple = list(tokenizer.encode("apple pie", add_special_tokens=False))
    banana = list(tokenizer.encode("banana", add_special_tokens=False))

    assert state.allowed_prefix(apple + banana) == len(apple)
    assert state.num_accepted == 0  # allowed_prefix leaves it where it was
    assert not state.advance_all([apple[0], banana[0]]) and state.num_accepted == 0
    assert state.catch_up(apple) and state.num_accepted == len(apple)
    assert state.catch_up(apple)  # nothing new to accept
    state.rollback(len(apple))
    assert state.advance_all(banana) and not state.terminated
    assert state.advance(tokenizer.eos_token_id) and state.terminated


@pytest.mark.parametrize(("rows", "vocab"), [(1, 64), (3, 49152), (2, 1000)])
def test_apply_bitmask_refuses_exactly_the_zero_bits(rows: int, vocab: int) -> None:
    """Bit j of word w is token 32 w + j; a vocabulary that ends inside a word keeps its size."""
    generator = np.random.default_rng(rows * vocab)
    words = (vocab + 31) // 32
    bitmask = generator.integers(-(2**31), 2**31, size=(rows, words), dtype=np.int32)
    logits = torch.randn(rows, vocab)
    allowed = [
        [bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1) for token in range(vocab)]
        for row in range(rows)
    ]
    expected = logits.masked_fill(~torch.tensor(allowed), float("-inf"))

    apply_bitmask(logits, bitmask)

    assert torch.equal(logits, expected)


def test_a_worker_start_loads_no_compiler_stack() -> None:
    """Importing the engine (every worker does) must not load torch's compiler (dynamo and
    inductor cost seconds of start-up per process; llguidance.torch's applier loads them)."""
    probe = (
        "import sys, pdserve.core.engine, pdserve.decode_service.main, "
        "pdserve.prefill_service.main; "
        "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
