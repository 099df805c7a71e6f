"""Session-wide fixtures: the real default model (prepared once into the user cache), prompts of
many lengths and transformers' greedy outputs for them (the oracle every path must match,
tests/oracle.py), both the oracle and strict mypy computed in the background from the session's
start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.oracle import (
    MAX_NEW_TOKENS,
    OracleRun,
    real_text_prompts,
    shared_prefix_prompts,
    start_oracle,
    structured_chat_prompts,
    transformers_greedy,
)

MYPY_TEST = "test_mypy_strict_is_clean"


@pytest.fixture(scope="session", autouse=True)
def mypy_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """Strict mypy, started before the run's first test when the run includes MYPY_TEST
    (tests/test_static_checks.py): half a minute of one core from a cold cache, at the lowest
    CPU priority, on what the tests that wait (on streams, drains, timeouts) leave idle instead
    of adding it at the end."""
    test = next((item for item in request.session.items if item.name == MYPY_TEST), None)
    if test is None:
        yield None
        return
    run = test.module.start_mypy(tmp_path_factory.mktemp("mypy-tree"))
    yield run
    run.stop()


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from pdserve.core.model.source import resolve_model

    return resolve_model(None)


ORACLE_FIXTURES = frozenset({"hf_greedy", "shared_hf_greedy", "structured_reference"})


@pytest.fixture(scope="session", autouse=True)
def oracle(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OracleRun | None]:
    """transformers' references (tests/oracle.py), computed in the background from the
    session's start when a test of the session needs one."""
    if not any(ORACLE_FIXTURES & set(item.fixturenames) for item in request.session.items):
        yield None
        return
    run = start_oracle(tmp_path_factory.mktemp("oracle") / "references.json")
    yield run
    run.stop()


def _reference(oracle: OracleRun | None, name: str) -> list[list[int]]:
    assert oracle is not None, f"{name}: the session started no oracle (ORACLE_FIXTURES)"
    return oracle.result(name)


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def prompts(tokenizer: Any) -> list[list[int]]:
    """Real-text prompts of PROMPT_LENGTHS tokens (each starting at a different word)."""
    return real_text_prompts(tokenizer)


@pytest.fixture(scope="session")
def hf_greedy(oracle: OracleRun | None) -> list[list[int]]:
    """transformers `generate(do_sample=False)` for every prompt, one at a time (no padding)."""
    return _reference(oracle, "hf_greedy")


@pytest.fixture(scope="session")
def max_new_tokens() -> int:
    """How many tokens `hf_greedy` generated per prompt."""
    return MAX_NEW_TOKENS


@pytest.fixture(scope="session")
def shared_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """For each shared length, tails of TAIL_LENGTHS after the same leading tokens."""
    return shared_prefix_prompts(prompts)


@pytest.fixture(scope="session")
def shared_hf_greedy(oracle: OracleRun | None) -> list[list[int]]:
    """transformers' greedy SHARED_MAX_TOKENS tokens for each of `shared_prompts`."""
    return _reference(oracle, "shared_hf_greedy")


# A sliding-window model (pdserve/testing/window_model.py), built once per session: its window is
# two 16-token blocks, and it generates WINDOW_MAX_TOKENS, so every sequence slides past it.
WINDOW = 32
WINDOW_MAX_TOKENS = 48


def _window_model(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, name: str, **kwargs: Any
) -> Path:
    from pdserve.testing.window_model import build_window_model

    return build_window_model(tmp_path_factory.mktemp(name) / "model", tokenizer_dir, **kwargs)


@pytest.fixture(scope="session")
def window_model_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Mistral with a 32-token sliding window and fixed-seed weights."""
    return _window_model(tmp_path_factory, model_dir, "mistral-w32", window=WINDOW)


@pytest.fixture(scope="session")
def window_hf_greedy(window_model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy WINDOW_MAX_TOKENS tokens of the sliding-window model per prompt."""
    return transformers_greedy(window_model_dir, prompts, WINDOW_MAX_TOKENS)


@pytest.fixture(scope="session")
def structured_prompts(tokenizer: Any) -> list[list[int]]:
    """A chat prompt for each of tests/structured_cases.py's CASES."""
    return structured_chat_prompts(tokenizer)


@pytest.fixture(scope="session")
def structured_reference(oracle: OracleRun | None) -> list[list[int]]:
    """transformers' greedy tokens for each case under llguidance's own mask calls, on the
    grammar the engine's compiler builds."""
    return _reference(oracle, "structured_reference")
