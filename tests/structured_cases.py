"""Requests under every kind of structured constraint, with what their output must be: shared by
the engine's tests (tests/core/test_structured_outputs.py) and the cluster's
(tests/integration/test_structured_cluster.py), whose reference is tests/conftest.py's
`structured_reference`."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import llguidance
import llguidance.numpy
import torch
import transformers

from pdserve.core.structured.params import StructuredOutputsParams

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


# The cases whose output is a few tokens whatever is sampled (a sampled JSON may run past
# max_tokens): the regex, the choice and the grammar.
SHORT = slice(2, 5)


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


class GuidanceLogitsProcessor(transformers.LogitsProcessor):
    """The reference's mask in transformers' `generate`: llguidance's own calls on a copy of the
    engine's compiled matcher (one processor per generate call, batch of one). Its numpy applier,
    not its torch one: that is a torch.compile'd function, seconds of compiling per test run."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher.deep_copy()
        self.started = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.started:  # the token sampled from the last call's scores
            assert self.matcher.consume_token(int(input_ids[0, -1])), self.matcher.get_error()
        self.started = True
        bitmask = llguidance.numpy.allocate_token_bitmask(1, scores.shape[-1])
        llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask, 0)
        llguidance.numpy.apply_token_bitmask_inplace(scores.numpy(), bitmask)  # in place, shared
        return scores
