"""The request mix of `pdserve bench disagg`: classes of prompt and output lengths, by weight.

A SPEC file is a JSON object `{"classes": [{"name": "chat", "weight": 0.8, "prompt_tokens":
{"min": 20, "max": 200}, "output_tokens": {"min": 50, "max": 200}}, ...]}` (uniform ranges).
Requests are drawn from a fixed seed, so every arm and rate sees the same sequence; prompts are
random token ids (prefill cost does not depend on which tokens), outputs are exactly
`output_tokens` long (EOS ignored), as in vLLM's disaggregated-prefill benchmark.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.planner.workload import TokenRange, token_range

SEED = 0
# Token ids drawn from here: clear of the special tokens at the start of the vocabulary.
FIRST_ORDINARY_TOKEN = 100

DEFAULT_SPEC: dict[str, Any] = {
    "classes": [
        {
            "name": "chat",
            "weight": 0.8,
            "prompt_tokens": {"min": 20, "max": 200},
            "output_tokens": {"min": 50, "max": 200},
        },
        {
            "name": "long",
            "weight": 0.2,
            "prompt_tokens": {"min": 1000, "max": 3000},
            "output_tokens": {"min": 20, "max": 100},
        },
    ]
}


@dataclass(frozen=True)
class RequestClass:
    name: str
    weight: float
    prompt_tokens: TokenRange
    output_tokens: TokenRange


def parse_spec(raw: dict[str, Any]) -> tuple[RequestClass, ...]:
    """The classes of a SPEC object; ValueError names the bad field."""
    classes = raw.get("classes")
    if not isinstance(classes, list) or not classes:
        raise ValueError("classes: must be a non-empty list")
    return tuple(_parse_class(item, f"classes[{index}]") for index, item in enumerate(classes))


def _parse_class(item: Any, where: str) -> RequestClass:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: must be an object")
    weight = item.get("weight", 1.0)
    if not isinstance(weight, int | float) or weight <= 0:
        raise ValueError(f"{where}.weight: must be > 0, got {weight!r}")
    return RequestClass(
        name=str(item.get("name", where)),
        weight=float(weight),
        prompt_tokens=token_range(item.get("prompt_tokens"), f"{where}.prompt_tokens"),
        output_tokens=token_range(item.get("output_tokens"), f"{where}.output_tokens"),
    )


def load_spec(path: Path | None) -> tuple[RequestClass, ...]:
    return parse_spec(DEFAULT_SPEC if path is None else json.loads(path.read_text()))


def call_data(
    classes: tuple[RequestClass, ...], count: int, vocab_size: int
) -> tuple[dict[str, Any], ...]:
    """`count` GenerateRequest objects in protobuf JSON (the load runner's `data`)."""
    rng = random.Random(SEED)
    weights = [c.weight for c in classes]
    requests = []
    for _ in range(count):
        chosen = rng.choices(classes, weights)[0]
        prompt = [
            rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size)
            for _ in range(chosen.prompt_tokens.draw(rng))
        ]
        sampling = {
            "max_tokens": chosen.output_tokens.draw(rng),
            "temperature": 0.0,
            "ignore_eos": True,
        }
        requests.append({"prompt_token_ids": {"ids": prompt}, "sampling": sampling})
    return tuple(requests)
