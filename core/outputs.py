"""What the engine reports back for each request."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pdserve.core.request import RequestStatus


class FinishReason(enum.StrEnum):
    """A str, as vLLM's `finish_reason` is: `out.finish_reason == "length"` holds."""

    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens reached
    ABORTED = "aborted"

    @classmethod
    def of(cls, status: RequestStatus) -> FinishReason | None:
        return _BY_STATUS.get(status)


_BY_STATUS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORTED,
}


@dataclass(frozen=True)
class TokenDelta:
    """New tokens of one request from one step (the last delta carries the finish reason)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class CompletionOutput:
    """One finished sample of a request (vLLM's `CompletionOutput`): `index` is its place among the
    request's n samples, and sample `index` ran with seed `seed + index`."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason


@dataclass(frozen=True)
class RequestOutput:
    """A finished prompt, as the offline API returns it (vLLM's `RequestOutput`): its n samples in
    `outputs`, by index. `prompt` is the text given, None when the prompt came as token ids."""

    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]
    finished: bool
