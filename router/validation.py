"""Checks a public GenerateRequest once, at the door, so workers only see valid requests.

Every refusal is an InvalidRequestError whose message starts with the proto field's name
(`prompt`, `prompt_token_ids`, `sampling.max_tokens`, `request_id`, ...).

Ids: the router names every request it admits with an id of its own (a fresh uuid4), and the
workers only ever see that one. The client's `request_id` is only echoed in its answers: clients
share no id space (two clients, or two router replicas, may well pick the same id, and a client's
"r/0" is what the router would call sample 0 of "r"), so an id taken from a client would let one
client's request overwrite, abort or refuse another's on the workers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pdserve.core.model.config import load_model_config
from pdserve.core.sampling_params import DEFAULT_TENANT, InvalidRequestError, SamplingParams
from pdserve.core.serving.sampling_proto import sampling_from_proto, sampling_to_proto
from pdserve.core.text.chat import ChatTokenizer
from pdserve.core.text.tokenizer import load_tokenizer
from pdserve.router.config import RequestCaps
from pdserve.router.places import Holder
from pdserve.router.slo_admission import NO_SLO, Slo
from pdserve.v1 import common_pb2, generation_pb2

# Longer texts are tokenized off the event loop so one big prompt does not stall every stream.
_INLINE_TOKENIZE_CHARS = 4096
MAX_REQUEST_ID_CHARS = 256


class Tokenizer(ChatTokenizer, Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class ModelLimits:
    """The model's facts and what one request may ask for: the flags' caps within its context."""

    model_name: str
    vocab_size: int
    max_position: int
    eos_token_ids: tuple[int, ...]
    max_prompt_tokens: int
    max_tokens: int
    max_stop_strings: int
    max_stop_string_chars: int

    @classmethod
    def from_model_dir(cls, model_dir: Path, caps: RequestCaps) -> ModelLimits:
        config = load_model_config(model_dir)
        room = config.max_position - 1  # a prompt leaves room for one token, and vice versa
        return cls(
            model_name=model_dir.name,
            vocab_size=config.vocab_size,
            max_position=config.max_position,
            eos_token_ids=config.eos_token_ids,
            max_prompt_tokens=min(caps.max_prompt_tokens or room, room),
            max_tokens=min(caps.max_tokens or room, room),
            max_stop_strings=caps.max_stop_strings,
            max_stop_string_chars=caps.max_stop_string_chars,
        )


@dataclass(frozen=True)
class ValidatedRequest:
    request_id: str  # the router's own (a sample's: `<id>/<i>`): what the workers see
    client_request_id: str  # echoed in the answers: the client's, else the router's own
    prompt_token_ids: tuple[int, ...]
    # Normalized: defaults filled in (max_tokens, top_p), so both tiers read the same values.
    sampling: common_pb2.SamplingParams
    priority: int
    slo: Slo = NO_SLO  # its own objectives (none: the router's --slo-ttft / --slo-tpot)
    # Whether its first placement checks the SLOs (router/slo_admission.py): a request's samples
    # after the first ride on the first one's admission.
    judged: bool = True
    # A migration's run: the output already streamed to the client, which the next worker
    # computes after the prompt and continues from (dispatch.py).
    resumed_output_token_ids: tuple[int, ...] = ()
    # The --max-queue places it holds (router/places.py): its first token marks it started, no
    # longer displaceable. None for requests that hold none (benchmarks' direct dispatches).
    places: Holder | None = None
    # Its tenant (router/tenants.py) and that tenant's weight, which the workers' `fair` policy
    # shares their steps by.
    tenant: str = DEFAULT_TENANT
    tenant_weight: float = 1.0

    def to_work(
        self, resumed_output_token_ids: Sequence[int] | None = None
    ) -> common_pb2.WorkRequest:
        """The request as the workers receive it (Reserve, GenerateLocal, Prefill): the one
        place the router copies its fields into a message. `resumed_output_token_ids` replaces
        this run's own (a live migration's reservation leaves the last streamed token out)."""
        if resumed_output_token_ids is None:
            resumed_output_token_ids = self.resumed_output_token_ids
        return common_pb2.WorkRequest(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling=self.sampling,
            priority=self.priority,
            resumed_output_token_ids=resumed_output_token_ids,
            tenant=self.tenant,
            tenant_weight=self.tenant_weight,
        )

    @property
    def log_name(self) -> str:
        """How the router's log lines name it: its own id (the workers' logs use it) and the
        client's."""
        return f"{self.request_id} (client id {self.client_request_id!r})"

    @property
    def context_length(self) -> int:
        """Tokens whose KV a run computes before it samples: the prompt and any resumed output."""
        return len(self.prompt_token_ids) + len(self.resumed_output_token_ids)


def load_validator(model_dir: Path, caps: RequestCaps) -> RequestValidator:
    """The model's own tokenizer (loaded as the workers load it) and limits; slow (imports
    transformers' tokenizer code), so the router runs it off the event loop."""
    return RequestValidator(load_tokenizer(model_dir), ModelLimits.from_model_dir(model_dir, caps))


class RequestValidator:
    def __init__(self, tokenizer: Tokenizer, limits: ModelLimits) -> None:
        self.tokenizer = tokenizer
        self.limits = limits

    async def validate(self, request: generation_pb2.GenerateRequest) -> ValidatedRequest:
        request_id = uuid.uuid4().hex
        client_request_id = self._client_request_id(request) or request_id
        params = sampling_from_proto(request.sampling, request.priority)
        self._check_stops(params)
        slo = Slo.from_proto(request.slo)
        prompt_ids = await self._prompt_token_ids(request)
        self._check_length(request, len(prompt_ids), params.max_tokens)
        return ValidatedRequest(
            request_id=request_id,
            client_request_id=client_request_id,
            prompt_token_ids=prompt_ids,
            sampling=sampling_to_proto(params),
            priority=request.priority,
            slo=slo,
        )

    def _check_stops(self, params: SamplingParams) -> None:
        most = self.limits.max_stop_strings
        if len(params.stop) > most:
            raise InvalidRequestError(
                "sampling.stop", f"at most {most} stop strings, got {len(params.stop)}"
            )
        if len(params.stop_token_ids) > most:
            raise InvalidRequestError(
                "sampling.stop_token_ids",
                f"at most {most} stop token ids, got {len(params.stop_token_ids)}",
            )
        longest = max((len(text) for text in params.stop), default=0)
        if longest > self.limits.max_stop_string_chars:
            raise InvalidRequestError(
                "sampling.stop",
                f"every stop string at most {self.limits.max_stop_string_chars} characters, "
                f"got {longest}",
            )

    def _client_request_id(self, request: generation_pb2.GenerateRequest) -> str | None:
        if not request.HasField("request_id"):
            return None
        if not request.request_id:
            raise InvalidRequestError("request_id", "must not be empty when set")
        if len(request.request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidRequestError(
                "request_id",
                f"at most {MAX_REQUEST_ID_CHARS} characters, got {len(request.request_id)}",
            )
        request_id: str = request.request_id
        return request_id

    async def _prompt_token_ids(self, request: generation_pb2.GenerateRequest) -> tuple[int, ...]:
        which = request.WhichOneof("input")
        if which == "prompt_token_ids":
            ids = tuple(request.prompt_token_ids.ids)
            if not ids:
                raise InvalidRequestError("prompt_token_ids", "must not be empty")
            too_big = [token for token in ids if token >= self.limits.vocab_size]
            if too_big:
                raise InvalidRequestError(
                    "prompt_token_ids",
                    f"every id must be below the vocabulary size {self.limits.vocab_size}, "
                    f"got {too_big[:5]}",
                )
            return ids
        if which is None or not request.prompt:
            raise InvalidRequestError(
                "prompt", "must not be empty (set prompt or prompt_token_ids)"
            )
        token_ids = tuple(await self._encode(request.prompt))
        if not token_ids:  # e.g. only control characters the tokenizer drops
            raise InvalidRequestError("prompt", "tokenizes to no tokens")
        return token_ids

    async def _encode(self, text: str) -> list[int]:
        if len(text) <= _INLINE_TOKENIZE_CHARS:
            return list(self.tokenizer.encode(text))
        return list(await asyncio.to_thread(self.tokenizer.encode, text))

    def _check_length(
        self, request: generation_pb2.GenerateRequest, prompt_len: int, max_tokens: int
    ) -> None:
        limits = self.limits
        context = limits.max_position
        if prompt_len > limits.max_prompt_tokens:
            field = request.WhichOneof("input") or "prompt"
            raise InvalidRequestError(
                field,
                f"{prompt_len} tokens, above limits.max_prompt_tokens ({limits.max_prompt_tokens}: "
                f"--max-prompt-tokens within the model's context of {context})",
            )
        if max_tokens > limits.max_tokens:
            raise InvalidRequestError(
                "sampling.max_tokens",
                f"{max_tokens}, above limits.max_tokens ({limits.max_tokens}: --max-tokens "
                f"within the model's context of {context})",
            )
        if prompt_len + max_tokens > context:
            raise InvalidRequestError(
                "sampling.max_tokens",
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                f"context of {context} tokens",
            )
