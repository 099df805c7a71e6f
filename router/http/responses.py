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


def usage_body(usage: common_pb2.Usage) -> Body:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


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

    def whole(self, text: str, reason: str | None, usage: common_pb2.Usage) -> Body:
        """The unary answer."""
        if self.endpoint is Endpoint.CHAT:
            choice: Body = {"message": {"role": "assistant", "content": text}}
            kind = "chat.completion"
        else:
            choice = {"text": text}
            kind = "text_completion"
        choice.update(index=0, finish_reason=reason, logprobs=None)
        return self._envelope(kind, [choice], usage_body(usage))

    def chunk(self, text: str, reason: str | None, first: bool) -> Body:
        """One stream event; chat's first one carries the assistant role, as OpenAI's does."""
        if self.endpoint is Endpoint.CHAT:
            delta: Body = {"role": "assistant", "content": text} if first else {"content": text}
            choice: Body = {"delta": delta}
        else:
            choice = {"text": text}
        choice.update(index=0, finish_reason=reason, logprobs=None)
        return self._envelope(self._chunk_kind, [choice], None)

    def usage_chunk(self, usage: common_pb2.Usage) -> Body:
        """The extra last event of `stream_options.include_usage`: no choices, only usage."""
        return self._envelope(self._chunk_kind, [], usage_body(usage))

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
