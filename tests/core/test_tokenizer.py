"""`load_tokenizer` gives what AutoTokenizer gives: the same class, ids and chat prompts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from pdserve.core.text.chat import ChatMessage, chat_prompt
from pdserve.core.text.tokenizer import GENERIC_TOKENIZER_CLASSES, load_tokenizer

TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
TEXTS = [
    "Hello world",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\n\n",
    "unicode: naïve café, 東京, emoji 🙂, math ∑",
    "<|im_start|>user\nspecial tokens inside text<|im_end|>",
    "<|endoftext|>",
    "x" * 3000,
    "",
]
CHATS = [
    [ChatMessage("user", "Hi")],
    [ChatMessage("system", "Be brief."), ChatMessage("user", "What is 2+2?")],
    [
        ChatMessage("user", "Name a colour."),
        ChatMessage("assistant", "Blue."),
        ChatMessage("user", "Another, with <|im_end|> in it."),
    ],
]


@pytest.fixture(scope="module")
def pair(model_dir: Path) -> tuple[Any, Any]:
    return load_tokenizer(model_dir), AutoTokenizer.from_pretrained(str(model_dir))


def test_default_model_loads_the_class_auto_tokenizer_loads(pair: tuple[Any, Any]) -> None:
    ours, auto = pair
    assert type(ours) is type(auto)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_auto_tokenizer(pair: tuple[Any, Any], text: str) -> None:
    ours, auto = pair
    assert ours.encode(text) == auto.encode(text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_ids_match_auto_tokenizer_on_any_text(pair: tuple[Any, Any], text: str) -> None:
    ours, auto = pair
    assert ours.encode(text) == auto.encode(text)


@pytest.mark.parametrize("messages", CHATS)
def test_chat_prompts_match_auto_tokenizer(
    pair: tuple[Any, Any], messages: list[ChatMessage]
) -> None:
    ours, auto = pair
    assert chat_prompt(ours, messages) == chat_prompt(auto, messages)


def _with_declared_class(model_dir: Path, target: Path, declared: str) -> Path:
    target.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(model_dir / name, target / name)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = declared
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("declared", [*sorted(GENERIC_TOKENIZER_CLASSES), "GPT2Tokenizer"])
def test_every_declared_class_loads_as_auto_tokenizer_loads_it(
    model_dir: Path, tmp_path: Path, declared: str
) -> None:
    """The generic names (the torch-free path; Llama 3 declares PreTrainedTokenizerFast) and a
    model-specific one (AutoTokenizer's path) give AutoTokenizer's class and ids."""
    folder = _with_declared_class(model_dir, tmp_path / "model", declared)
    ours, auto = load_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert type(ours) is type(auto)
    assert ours.encode(TEXTS[3]) == auto.encode(TEXTS[3])
