"""The request mix of `pdserve bench disagg`: classes of prompt and output lengths, by weight,
each with its TTFT SLO, and the plan of the requests every point of a run sends.

A SPEC file is a JSON object:

    {"classes": [
        {"name": "chat", "weight": 0.8,
         "prompt_tokens": {"min": 20, "max": 200}, "output_tokens": {"min": 50, "max": 200},
         "ttft_slo": {"seconds": 2.0}},
        {"name": "long", "weight": 0.2,
         "prompt_tokens": {"min": 1000, "max": 3000}, "output_tokens": {"min": 20, "max": 100},
         "ttft_slo": {"seconds": 1.0, "per_prompt_token": 0.004},
         "shared_prefix": {"groups": 2, "tokens": 512}}
    ]}

Lengths are uniform ranges. A class's TTFT SLO is `seconds + per_prompt_token * prompt tokens`
(DistServe sets SLOs per application; a long-prompt SLO that grows with the prompt is what a
summarisation user expects); the TPOT SLO is one for all (`--slo-tpot`). `shared_prefix` (optional)
makes the class's prompts start with one of `groups` prefixes of `tokens` tokens, drawn afresh for
every point of the run: prompts then share exactly that much, and the prefix cache is expected to
hit (`prefix_hit_tokens` > 0).

Every point (rate, repeat) draws its own requests from a seed of its own, the same for every arm:
no prompt repeats within a run, so the prefix cache (on, as users run it) finds nothing a point
did not ask to share. Prompts are random token ids (prefill cost does not depend on which
tokens); outputs are exactly `output_tokens` long (EOS ignored), as in vLLM's
disaggregated-prefill benchmark.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.planner.workload import TokenRange, token_range

# Token ids drawn from here: clear of the special tokens at the start of the vocabulary.
FIRST_ORDINARY_TOKEN = 100

DEFAULT_SPEC: dict[str, Any] = {
    "classes": [
        {
            "name": "chat",
            "weight": 0.8,
            "prompt_tokens": {"min": 20, "max": 200},
            "output_tokens": {"min": 50, "max": 200},
            "ttft_slo": {"seconds": 2.0},
        },
        {
            "name": "long",
            "weight": 0.2,
            "prompt_tokens": {"min": 1000, "max": 3000},
            "output_tokens": {"min": 20, "max": 100},
            "ttft_slo": {"seconds": 4.0, "per_prompt_token": 0.012},
        },
    ]
}


@dataclass(frozen=True)
class TtftSlo:
    seconds: float
    per_prompt_token: float = 0.0

    def for_prompt(self, prompt_tokens: int) -> float:
        return self.seconds + self.per_prompt_token * prompt_tokens


@dataclass(frozen=True)
class SharedPrefix:
    groups: int
    tokens: int


@dataclass(frozen=True)
class RequestClass:
    name: str
    weight: float
    prompt_tokens: TokenRange
    output_tokens: TokenRange
    ttft_slo: TtftSlo
    shared_prefix: SharedPrefix | None = None


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a point: what is sent, and the TTFT it must meet."""

    class_name: str
    prompt: tuple[int, ...]
    max_tokens: int
    ttft_slo_s: float

    def call_data(self, with_slo: bool = False, request_id: str | None = None) -> dict[str, Any]:
        """The GenerateRequest in protobuf JSON (the load runner's `data`); `with_slo`: its
        TTFT SLO as the request's own (`slo.ttft_seconds`); `request_id`: the client's id."""
        sampling = {"max_tokens": self.max_tokens, "temperature": 0.0, "ignore_eos": True}
        data: dict[str, Any] = {"prompt_token_ids": {"ids": list(self.prompt)}}
        data["sampling"] = sampling
        if request_id is not None:
            data["request_id"] = request_id
        if with_slo:
            data["slo"] = {"ttft_seconds": self.ttft_slo_s}
        return data


def parse_spec(raw: dict[str, Any]) -> tuple[RequestClass, ...]:
    """The classes of a SPEC object; ValueError names the bad field."""
    classes = raw.get("classes")
    if not isinstance(classes, list) or not classes:
        raise ValueError("classes: must be a non-empty list")
    return tuple(_parse_class(item, f"classes[{index}]") for index, item in enumerate(classes))


def _parse_class(item: Any, where: str) -> RequestClass:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: must be an object")
    weight = _number(item.get("weight", 1.0), f"{where}.weight", above_zero=True)
    prompt_tokens = token_range(item.get("prompt_tokens"), f"{where}.prompt_tokens")
    shared = _parse_shared_prefix(item.get("shared_prefix"), f"{where}.shared_prefix")
    if shared is not None and shared.tokens >= prompt_tokens.min:
        raise ValueError(
            f"{where}.shared_prefix.tokens: must be below prompt_tokens.min "
            f"({prompt_tokens.min}), got {shared.tokens}"
        )
    return RequestClass(
        name=str(item.get("name", where)),
        weight=weight,
        prompt_tokens=prompt_tokens,
        output_tokens=token_range(item.get("output_tokens"), f"{where}.output_tokens"),
        ttft_slo=_parse_ttft_slo(item.get("ttft_slo"), f"{where}.ttft_slo"),
        shared_prefix=shared,
    )


def _parse_ttft_slo(raw: Any, where: str) -> TtftSlo:
    if not isinstance(raw, dict):
        raise ValueError(f'{where}: must be an object like {{"seconds": 2.0}}')
    return TtftSlo(
        seconds=_number(raw.get("seconds", 0.0), f"{where}.seconds"),
        per_prompt_token=_number(raw.get("per_prompt_token", 0.0), f"{where}.per_prompt_token"),
    )


def _parse_shared_prefix(raw: Any, where: str) -> SharedPrefix | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f'{where}: must be an object like {{"groups": 2, "tokens": 256}}')
    return SharedPrefix(
        groups=_count(raw.get("groups"), f"{where}.groups"),
        tokens=_count(raw.get("tokens"), f"{where}.tokens"),
    )


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: must be an integer >= 1, got {value!r}")
    return value


def _number(value: Any, where: str, *, above_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{where}: must be a number >= 0, got {value!r}")
    if above_zero and value == 0:
        raise ValueError(f"{where}: must be > 0, got {value!r}")
    return float(value)


def load_spec(path: Path | None) -> tuple[RequestClass, ...]:
    return parse_spec(DEFAULT_SPEC if path is None else json.loads(path.read_text()))


def point_seed(base_seed: int, label: str) -> str:
    """The seed of one point of a run ("rate=0.5/repeat=1", "warmup"): the same for every arm,
    different for every point (str seeds are hashed by random.Random, stable across runs)."""
    return f"pdserve-bench-disagg/{base_seed}/{label}"


def plan_requests(
    classes: tuple[RequestClass, ...], count: int, vocab_size: int, seed: str
) -> tuple[PlannedRequest, ...]:
    """`count` requests drawn from the classes by weight, with fresh prompts from `seed`."""
    rng = random.Random(seed)
    prefixes = {
        c.name: [
            _tokens(rng, c.shared_prefix.tokens, vocab_size) for _ in range(c.shared_prefix.groups)
        ]
        for c in classes
        if c.shared_prefix is not None
    }
    weights = [c.weight for c in classes]
    planned = []
    for _ in range(count):
        chosen = rng.choices(classes, weights)[0]
        length = chosen.prompt_tokens.draw(rng)
        prefix = rng.choice(prefixes[chosen.name]) if chosen.name in prefixes else ()
        prompt = prefix + _tokens(rng, length - len(prefix), vocab_size)
        planned.append(
            PlannedRequest(
                class_name=chosen.name,
                prompt=prompt,
                max_tokens=chosen.output_tokens.draw(rng),
                ttft_slo_s=chosen.ttft_slo.for_prompt(length),
            )
        )
    return tuple(planned)


def _tokens(rng: random.Random, count: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(count))
