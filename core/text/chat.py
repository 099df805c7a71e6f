"""Chat messages -> one prompt string, by the model's own chat template.

The one place pdserve applies a chat template: `pdserve generate --chat` and the HTTP door's
`/v1/chat/completions` both call `chat_prompt`, so the same messages give the same prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system | user | assistant (whatever roles the model's template knows)
    content: str


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer this module uses."""

    def apply_chat_template(
        self, conversation: list[dict[str, str]], *, tokenize: bool, add_generation_prompt: bool
    ) -> object: ...


def chat_prompt(tokenizer: ChatTokenizer, messages: Sequence[ChatMessage]) -> str:
    """The prompt text that asks the model for the assistant's next turn."""
    conversation = [{"role": message.role, "content": message.content} for message in messages]
    prompt = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    if not isinstance(prompt, str):
        raise TypeError(f"apply_chat_template returned {type(prompt).__name__}, not text")
    return prompt
