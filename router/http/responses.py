"""OpenAI response bodies: whole answers and stream chunks, for completions and chat."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from pdserve.v1 import common_pb2

_FINISH_REASONS = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORTED: "abort",  # vLLM's name; OpenAI has none for it
}

Body = dict[str, object]


class Endpoint(enum.Enum):
    COMPLETIONS = "/v1/completions"
    CHAT = "/v1/chat/completions"


def finish_reason(value: common_pb2.FinishReason.ValueType) -> str | None:
    return _FINISH_REASONS.get(value)


def usage_body(usages: list[common_pb2.Usage]) -> Body:
    """One request's usage over its samples: the prompt counted once (it is one prompt, as
    OpenAI and vLLM count it), the completions summed."""
    prompt_tokens = usages[0].prompt_tokens
    completion_tokens = sum(usage.completion_tokens for usage in usages)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True)
class Completion:
    """One sample's whole answer."""

    text: str
    reason: str | None
    usage: common_pb2.Usage


@dataclass(frozen=True)
class Answer:
    """The shape of one request's answers: its id, model, and which endpoint it came by."""

    endpoint: Endpoint
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        prefix = "chatcmpl" if self.endpoint is Endpoint.CHAT else "cmpl"
        return f"{prefix}-{self.request_id}"

    def whole(self, samples: list[Completion]) -> Body:
        """The unary answer: one choice per sample, choice i being sample i."""
        choices = [self._choice(index, sample) for index, sample in enumerate(samples)]
        kind = "chat.completion" if self.endpoint is Endpoint.CHAT else "text_completion"
        return self._envelope(kind, choices, usage_body([sample.usage for sample in samples]))

    def _choice(self, index: int, sample: Completion) -> Body:
        if self.endpoint is Endpoint.CHAT:
            choice: Body = {"message": {"role": "assistant", "content": sample.text}}
        else:
            choice = {"text": sample.text}
        choice.update(index=index, finish_reason=sample.reason, logprobs=None)
        return choice

    def chunk(self, index: int, text: str, reason: str | None, first: bool) -> Body:
        """One stream event of sample `index`; chat's first event of each sample carries the
        assistant role, as OpenAI's does."""
        if self.endpoint is Endpoint.CHAT:
            delta: Body = {"role": "assistant", "content": text} if first else {"content": text}
            choice: Body = {"delta": delta}
        else:
            choice = {"text": text}
        choice.update(index=index, finish_reason=reason, logprobs=None)
        return self._envelope(self._chunk_kind, [choice], None)

    def usage_chunk(self, usages: list[common_pb2.Usage]) -> Body:
        """The extra last event of `stream_options.include_usage`: no choices, only usage."""
        return self._envelope(self._chunk_kind, [], usage_body(usages))

    @property
    def _chunk_kind(self) -> str:
        return "chat.completion.chunk" if self.endpoint is Endpoint.CHAT else "text_completion"

    def _envelope(self, kind: str, choices: list[Body], usage: Body | None) -> Body:
        return {
            "id": self.response_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        }
