"""Workload SPECs: a JSONL trace, or a JSON object describing a Poisson process.

Trace, one request a line: `{"arrival_s": 0.12, "prompt_tokens": 87, "output_tokens": 140}`.
Poisson: `{"rate": 2.0, "duration_s": 600, "prompt_tokens": {"min": 10, "max": 100},
"output_tokens": {"min": 20, "max": 200}}` (uniform ranges, both ends inclusive), with an optional
`"seed"` (default 0) so that every command given the same SPEC sees the same requests.
A file whose first non-blank character is `{` and that parses as one JSON object is a Poisson
SPEC; anything else is read as JSONL.

Prompts are distinct unless the workload says otherwise: a trace line may add `"prefix_id": 3,
"prefix_tokens": 64` (requests with the same prefix_id share their first prefix_tokens tokens),
and a Poisson SPEC `"shared_prefix": {"groups": 4, "tokens": 64}` (each request joins one of 4
prefixes, drawn uniformly, sharing up to 64 leading tokens with that group).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


class WorkloadSpecError(ValueError):
    """A SPEC that cannot be used; the message names the field (and the line of a trace)."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    # Requests with the same prefix_id share their first prefix_tokens prompt tokens; the rest of
    # every prompt is its own. None: the whole prompt is its own.
    prefix_id: int | None = None
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if (self.prefix_id is None) != (self.prefix_tokens == 0):
            raise WorkloadSpecError("prefix_id, prefix_tokens: give both or neither")
        if self.prefix_tokens > self.prompt_tokens:
            raise WorkloadSpecError(
                f"prefix_tokens: must not exceed prompt_tokens ({self.prompt_tokens}), "
                f"got {self.prefix_tokens}"
            )


@dataclass(frozen=True)
class TokenRange:
    min: int
    max: int

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.min, self.max)


@dataclass(frozen=True)
class SharedPrefix:
    """Each request shares its leading `tokens` tokens (all of a shorter prompt) with the other
    requests of one of `groups` prefixes, drawn uniformly."""

    groups: int
    tokens: int

    def draw(self, rng: random.Random, prompt_tokens: int) -> tuple[int, int]:
        """(prefix_id, prefix_tokens) of one request."""
        return rng.randrange(self.groups), min(self.tokens, prompt_tokens)


@dataclass(frozen=True)
class PoissonSpec:
    rate: float
    duration_s: float
    prompt_tokens: TokenRange
    output_tokens: TokenRange
    seed: int = 0
    shared_prefix: SharedPrefix | None = None

    def requests(self) -> list[TraceRequest]:
        """Exponential gaps at `rate` until `duration_s`; lengths drawn uniformly. Prefixes come
        from a generator of their own, so adding `shared_prefix` to a SPEC keeps its requests'
        arrivals and lengths."""
        rng = random.Random(self.seed)
        prefix_rng = random.Random(f"shared_prefix:{self.seed}")
        requests: list[TraceRequest] = []
        now = rng.expovariate(self.rate)
        while now < self.duration_s:
            prompt, output = self.prompt_tokens.draw(rng), self.output_tokens.draw(rng)
            shared = self.shared_prefix
            prefix = shared.draw(prefix_rng, prompt) if shared is not None else (None, 0)
            requests.append(TraceRequest(now, prompt, output, *prefix))
            now += rng.expovariate(self.rate)
        return requests

    def with_rate(self, rate: float) -> PoissonSpec:
        return replace(self, rate=rate)


Workload = PoissonSpec | tuple[TraceRequest, ...]


def load_spec(path: Path) -> Workload:
    try:
        text = path.read_text()
    except OSError as error:
        raise WorkloadSpecError(f"workload: cannot read {path}: {error.strerror}") from error
    return parse_spec(text, str(path))


def parse_spec(text: str, source: str) -> Workload:
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # several objects: a trace
        if isinstance(data, dict) and "rate" in data:
            return parse_poisson(data)
    return parse_trace(text, source)


def requests_of(workload: Workload) -> list[TraceRequest]:
    return workload.requests() if isinstance(workload, PoissonSpec) else list(workload)


def parse_poisson(data: dict[str, Any]) -> PoissonSpec:
    known = {"rate", "duration_s", "prompt_tokens", "output_tokens", "seed", "shared_prefix"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise WorkloadSpecError(f"{unknown[0]}: unknown key (known: {sorted(known)})")
    rate = _positive_number(data, "rate")
    duration = _positive_number(data, "duration_s")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise WorkloadSpecError("seed: must be an integer")
    prefix = data.get("shared_prefix")
    return PoissonSpec(
        rate,
        duration,
        token_range(data.get("prompt_tokens"), "prompt_tokens"),
        token_range(data.get("output_tokens"), "output_tokens"),
        seed,
        None if prefix is None else shared_prefix(prefix, "shared_prefix"),
    )


def parse_trace(text: str, source: str) -> tuple[TraceRequest, ...]:
    requests: list[TraceRequest] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise WorkloadSpecError(f"{where}: not valid JSON: {error.msg}") from error
        if not isinstance(item, dict):
            raise WorkloadSpecError(f"{where}: must be a JSON object")
        requests.append(_trace_request(item, where))
    if not requests:
        raise WorkloadSpecError(f"workload: {source} holds no requests")
    return tuple(sorted(requests, key=lambda request: request.arrival_s))


TRACE_KEYS = ("arrival_s", "prompt_tokens", "output_tokens", "prefix_id", "prefix_tokens")


def _trace_request(item: dict[str, Any], where: str) -> TraceRequest:
    unknown = sorted(set(item) - set(TRACE_KEYS))
    if unknown:
        raise WorkloadSpecError(f"{unknown[0]}: unknown key (known: {list(TRACE_KEYS)}) ({where})")
    arrival = item.get("arrival_s")
    if isinstance(arrival, bool) or not isinstance(arrival, int | float) or arrival < 0:
        raise WorkloadSpecError(f"arrival_s: must be a number >= 0 ({where})")
    prompt = _count(item.get("prompt_tokens"), "prompt_tokens", where)
    output = _count(item.get("output_tokens"), "output_tokens", where)
    prefix_id, prefix_tokens = item.get("prefix_id"), item.get("prefix_tokens")
    if prefix_id is None and prefix_tokens is None:
        return TraceRequest(float(arrival), prompt, output)
    if isinstance(prefix_id, bool) or not isinstance(prefix_id, int) or prefix_id < 0:
        raise WorkloadSpecError(f"prefix_id: must be an integer >= 0, got {prefix_id!r} ({where})")
    prefix_tokens = _count(prefix_tokens, "prefix_tokens", where)
    if prefix_tokens > prompt:
        raise WorkloadSpecError(f"prefix_tokens: must not exceed prompt_tokens ({where})")
    return TraceRequest(float(arrival), prompt, output, prefix_id, prefix_tokens)


def _positive_number(data: dict[str, Any], name: str) -> float:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise WorkloadSpecError(f"{name}: must be a number > 0, got {value!r}")
    return float(value)


def token_range(value: Any, name: str) -> TokenRange:
    """`{"min": N, "max": M}` (whole numbers, 1 <= N <= M) as a TokenRange; the error names
    `name`. Shared by every workload file that gives lengths as ranges (bench disagg too)."""
    if not isinstance(value, dict) or set(value) != {"min", "max"}:
        raise WorkloadSpecError(f'{name}: must be {{"min": N, "max": M}}, got {value!r}')
    low = _count(value["min"], f"{name}.min", "spec")
    high = _count(value["max"], f"{name}.max", "spec")
    if low > high:
        raise WorkloadSpecError(f"{name}: min ({low}) must not exceed max ({high})")
    return TokenRange(low, high)


def shared_prefix(value: Any, name: str) -> SharedPrefix:
    """`{"groups": G, "tokens": T}` (whole numbers >= 1) as a SharedPrefix; the error names
    `name`. Shared by every workload file that asks for shared prefixes."""
    if not isinstance(value, dict) or set(value) != {"groups", "tokens"}:
        raise WorkloadSpecError(f'{name}: must be {{"groups": G, "tokens": T}}, got {value!r}')
    groups = _count(value["groups"], f"{name}.groups", "spec")
    return SharedPrefix(groups, _count(value["tokens"], f"{name}.tokens", "spec"))


def _count(value: object, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadSpecError(f"{name}: must be an integer >= 1, got {value!r} ({where})")
    return value
