"""What a request's output must follow: a JSON schema, any JSON object, a regex, a grammar or one
of a list of strings (vLLM's `StructuredOutputsParams`, same field names).

Torch-free: the router validates these at its doors. Checked here is what needs no tokenizer
(exactly one constraint, the schema is JSON, the strings are not empty); whether the schema,
regex or grammar compiles is the workers' check (core/structured/grammar.py), before any KV is
reserved.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdserve.core.sampling_params import InvalidRequestError

MAX_CONSTRAINT_CHARS = 1 << 16  # 64 KiB of schema, regex or grammar text per request
MAX_CHOICES = 256


class StructuredKind(enum.Enum):
    """Which constraint a request carries; the value is its field name (errors name it)."""

    JSON = "json"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    GRAMMAR = "grammar"
    CHOICE = "choice"


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one constraint. `json` is the schema's text (a dict is dumped to it, so the same
    schema is the same key in every worker's compile cache); `grammar` is GBNF (llama.cpp's
    EBNF, `root ::= ...`) or Lark (`start: ...`)."""

    json: str | dict[str, Any] | None = None  # a dict becomes its text at once
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    choice: Sequence[str] | None = None  # kept as a tuple

    def __post_init__(self) -> None:
        if isinstance(self.json, dict):
            object.__setattr__(self, "json", json.dumps(self.json))
        if self.choice is not None and not isinstance(self.choice, str):
            object.__setattr__(self, "choice", tuple(self.choice))
        set_fields = [kind for kind in StructuredKind if _is_set(self, kind)]
        if len(set_fields) != 1:
            named = ", ".join(kind.value for kind in set_fields) or "none"
            raise InvalidRequestError(
                "structured",
                f"exactly one of json, json_object, regex, grammar, choice (got {named})",
            )
        self._check(set_fields[0])

    @property
    def kind(self) -> StructuredKind:
        return next(kind for kind in StructuredKind if _is_set(self, kind))

    @property
    def text(self) -> str:
        """The constraint as one string: the compile cache's key with `kind`."""
        kind = self.kind
        if kind is StructuredKind.JSON_OBJECT:
            return ""
        if kind is StructuredKind.CHOICE:
            return json.dumps(self.choice)
        value = getattr(self, kind.value)
        assert isinstance(value, str)  # checked at construction
        return value

    def _check(self, kind: StructuredKind) -> None:
        field = f"structured.{kind.value}"
        if kind is StructuredKind.JSON_OBJECT:
            return
        if kind is StructuredKind.CHOICE:
            _check_choices(field, self.choice)
            return
        value = getattr(self, kind.value)
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequestError(field, "must be a non-empty string")
        if len(value) > MAX_CONSTRAINT_CHARS:
            raise InvalidRequestError(field, f"is longer than {MAX_CONSTRAINT_CHARS} characters")
        if kind is StructuredKind.JSON:
            _check_schema(field, value)


def _is_set(params: StructuredOutputsParams, kind: StructuredKind) -> bool:
    value = getattr(params, kind.value)
    return value is True if kind is StructuredKind.JSON_OBJECT else value is not None


def _check_choices(field: str, choice: object) -> None:
    if not isinstance(choice, tuple) or not choice:
        raise InvalidRequestError(field, "must be a non-empty list of strings")
    if len(choice) > MAX_CHOICES:
        raise InvalidRequestError(field, f"has more than {MAX_CHOICES} choices")
    if any(not isinstance(option, str) or not option for option in choice):
        raise InvalidRequestError(field, "every choice must be a non-empty string")


def _check_schema(field: str, text: str) -> None:
    try:
        schema: Any = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidRequestError(field, f"is not JSON: {error}") from None
    if not isinstance(schema, dict | bool):
        raise InvalidRequestError(field, "must be a JSON schema (an object or a boolean)")
