"""Session-wide fixtures: the real default model (prepared once into the user cache), prompts of
many lengths and transformers' greedy outputs for them (the oracle every path must match), and
strict mypy started in the background."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

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


PROMPT_LENGTHS = (1, 7, 16, 17, 63, 130, 250, 500)
MAX_NEW_TOKENS = 24

_TEXT = (
    "The history of computing is a story of people trying to make machines do arithmetic "
    "faster than a clerk with pen and paper. Early mechanical calculators added and "
    "multiplied with gears; punched cards later stored data and programs. In the middle of the "
    "twentieth century, electronic computers replaced relays with vacuum tubes, and then with "
    "transistors, which were smaller, cooler and far more reliable. Integrated circuits put "
    "many transistors on one chip, and the microprocessor put a whole computer on one. "
)


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def prompts(tokenizer: Any) -> list[list[int]]:
    """Real-text prompts of PROMPT_LENGTHS tokens (each starting at a different word)."""
    ids: list[int] = tokenizer.encode(_TEXT * 12)
    return [ids[3 * i : 3 * i + length] for i, length in enumerate(PROMPT_LENGTHS)]


@pytest.fixture(scope="session")
def hf_greedy(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """transformers `generate(do_sample=False)` for every prompt, one at a time (no padding)."""
    return transformers_greedy(model_dir, prompts, MAX_NEW_TOKENS)


def transformers_greedy(
    model_dir: Path,
    prompts: list[list[int]],
    max_new_tokens: int,
    logits_processors: Callable[[int], list[Any]] | None = None,
) -> list[list[int]]:
    """`logits_processors(i)`: fresh logits processors for prompt i (one generate each)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    outputs = []
    with torch.inference_mode():
        for index, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            generated = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                logits_processor=logits_processors(index) if logits_processors else None,
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


@pytest.fixture(scope="session")
def max_new_tokens() -> int:
    """How many tokens `hf_greedy` generated per prompt."""
    return MAX_NEW_TOKENS


# Prompts that share leading tokens, for the prefix cache (tests/core/test_prefix_cache.py).
SHARED_LENGTHS = (0, 9, 100)  # none, part of one 16-token block, six blocks and a bit
TAIL_LENGTHS = (5, 23, 40)
SHARED_MAX_TOKENS = 12


@pytest.fixture(scope="session")
def shared_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """For each shared length, tails of TAIL_LENGTHS after the same leading tokens."""
    source = prompts[-1]  # 500 tokens of real text
    out = []
    for shared in SHARED_LENGTHS:
        for index, tail in enumerate(TAIL_LENGTHS):
            start = 120 + 40 * index
            out.append(source[:shared] + source[start : start + tail])
    return out


@pytest.fixture(scope="session")
def shared_hf_greedy(model_dir: Path, shared_prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy SHARED_MAX_TOKENS tokens for each of `shared_prompts`."""
    return transformers_greedy(model_dir, shared_prompts, SHARED_MAX_TOKENS)


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
    from tests.structured_cases import CASES, chat_prompt

    return [chat_prompt(tokenizer, question) for question, _ in CASES]


@pytest.fixture(scope="session")
def structured_reference(
    model_dir: Path, tokenizer: Any, structured_prompts: list[list[int]]
) -> list[list[int]]:
    """transformers' greedy tokens for each case under llguidance's own mask calls, on the
    grammar the engine's compiler builds."""
    from pdserve.core.model.config import load_model_config
    from pdserve.core.structured.grammar import Grammars
    from tests.structured_cases import CASES, MAX_TOKENS, GuidanceLogitsProcessor

    config = load_model_config(model_dir)
    grammars = Grammars(tokenizer, config.vocab_size, config.eos_token_ids)

    def processors(index: int) -> list[Any]:
        return [GuidanceLogitsProcessor(grammars.compiled(CASES[index][1]))]

    return transformers_greedy(model_dir, structured_prompts, MAX_TOKENS, processors)
