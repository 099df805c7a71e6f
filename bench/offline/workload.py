"""Offline benchmark workloads: JSON lists of `{"prompt": [token ids], "max_tokens": N}`.

Every request arrives at t=0 and runs greedy with `ignore_eos`, so each one produces exactly its
`max_tokens` and the output token count of a run is known before it starts.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pdserve.core.model.source import resolve_model

WORKLOAD_DIR = Path(__file__).parent / "workloads"


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class WorkloadRequest:
    prompt: tuple[int, ...]
    max_tokens: int


def workload_and_model(
    workload: Path, model: str | None
) -> tuple[list[WorkloadRequest], Path] | None:
    """A benchmark's two inputs; None (after printing the error) when either is unusable."""
    try:
        return load_workload(workload), resolve_model(model)
    except (WorkloadError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return None


def load_workload(path: Path) -> list[WorkloadRequest]:
    """Reads and validates a workload file."""
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise WorkloadError(f"workload: cannot read {path}: {error.strerror}") from error
    except json.JSONDecodeError as error:
        raise WorkloadError(f"workload: {path} is not valid JSON: {error}") from error
    return parse_workload(data, str(path))


def parse_workload(data: object, source: str) -> list[WorkloadRequest]:
    if not isinstance(data, list) or not data:
        raise WorkloadError(f"workload: {source} must hold a non-empty JSON list of requests")
    return [_parse_request(item, f"{source}[{index}]") for index, item in enumerate(data)]


def _parse_request(item: object, where: str) -> WorkloadRequest:
    if not isinstance(item, dict):
        raise WorkloadError(f"workload: {where} must be an object with prompt and max_tokens")
    prompt = item.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise WorkloadError(f"prompt: {where}.prompt must be a non-empty list of token ids")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in prompt):
        raise WorkloadError(f"prompt: {where}.prompt must hold only non-negative integers")
    max_tokens = item.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise WorkloadError(f"max_tokens: {where}.max_tokens must be an integer >= 1")
    return WorkloadRequest(prompt=tuple(prompt), max_tokens=max_tokens)


def save_workload(
    requests: list[WorkloadRequest],
    path: Path,
    extra: dict[str, list[str]] | None = None,
) -> None:
    """One request per line, so the files diff and review well. `extra`: more fields, one value
    per request (a benchmark's own, e.g. `bench structured`'s schema names)."""
    columns = extra or {}
    lines = [
        json.dumps(
            {
                "prompt": list(r.prompt),
                "max_tokens": r.max_tokens,
                **{name: values[index] for name, values in columns.items()},
            },
            separators=(",", ":"),
        )
        for index, r in enumerate(requests)
    ]
    path.write_text("[\n" + ",\n".join(lines) + "\n]\n")


def total_output_tokens(requests: list[WorkloadRequest]) -> int:
    return sum(request.max_tokens for request in requests)
