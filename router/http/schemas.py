"""OpenAI request bodies (pydantic), turned into the router's own `GenerateRequest`.

Field checks that belong to OpenAI's shape (types, ranges, `logprobs`) fail here with the
OpenAI parameter's name; everything else (prompt length, context, stop strings) is checked by the
same validator as the gRPC door, and `errors.param_of` maps its field names back to OpenAI's
(`params()` lists where a body's names differ).
Unknown fields are ignored, as OpenAI-compatible servers do for clients that send more.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.core.text.chat import ChatMessage
from pdserve.v1 import common_pb2, generation_pb2

# OpenAI's default for /v1/completions; chat has none, so both use the gRPC API's default.
DEFAULT_MAX_TOKENS = 16


class StreamOptions(BaseModel):
    include_usage: bool = False


class Slo(BaseModel):
    """pdserve's extension: this request's SLOs (the gRPC `GenerateRequest.slo`)."""

    model_config = ConfigDict(extra="forbid")

    ttft_seconds: float = Field(default=0.0, ge=0.0)
    tpot_seconds: float = Field(default=0.0, ge=0.0)


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`. `strict` is accepted either way: the output
    always follows the schema (its grammar masks every token)."""

    name: str = "response"
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's extension `structured_outputs` (the gRPC `SamplingParams.structured`): exactly one
    of its fields."""

    model_config = ConfigDict(extra="forbid")

    json_: str | dict[str, Any] | bool | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None

    def to_proto(self) -> common_pb2.StructuredOutputs:
        texts = (self.json_, self.regex, self.grammar, self.choice)
        # Checked here: a proto oneof would silently keep only the last one set.
        if sum(value is not None for value in texts) + bool(self.json_object) != 1:
            raise InvalidRequestError(
                "structured_outputs", "set exactly one of json, json_object, regex, grammar, choice"
            )
        message = common_pb2.StructuredOutputs()
        if self.json_ is not None:
            message.json = self.json_ if isinstance(self.json_, str) else json.dumps(self.json_)
        elif self.json_object:
            message.json_object = True
        elif self.regex is not None:
            message.regex = self.regex
        elif self.grammar is not None:
            message.grammar = self.grammar
        elif self.choice is not None:
            message.choice.options.extend(self.choice)
        return message


class _Sampling(BaseModel):
    """Parameters both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # vLLM's extension; 0 = off
    seed: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1)  # samples fan out at the router (router/samples.py)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM's extension, used by benchmarks such as guidellm
    slo: Slo | None = None  # pdserve's extension: refused at once if predicted to miss it
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's extension

    def sampling(self) -> common_pb2.SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        message = common_pb2.SamplingParams(
            max_tokens=self._max_tokens(),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=stop,
            ignore_eos=self.ignore_eos,
            n=self.n,
        )
        if self.seed is not None:
            message.seed = self.seed
        structured = self._structured()
        if structured is not None:
            message.structured.CopyFrom(structured)
        return message

    def _structured(self) -> common_pb2.StructuredOutputs | None:
        """The constraint from `response_format` or `structured_outputs` (not both)."""
        from_format = _format_constraint(self.response_format)
        if from_format is not None and self.structured_outputs is not None:
            raise InvalidRequestError(
                "structured_outputs", "give response_format or structured_outputs, not both"
            )
        if self.structured_outputs is not None:
            return self.structured_outputs.to_proto()
        return from_format

    def _max_tokens(self) -> int:
        return self.max_tokens or DEFAULT_MAX_TOKENS

    def request(self) -> generation_pb2.GenerateRequest:
        """The gRPC request with what both endpoints share (the prompt aside)."""
        request = generation_pb2.GenerateRequest(sampling=self.sampling())
        if self.slo is not None:
            request.slo.ttft_seconds = self.slo.ttft_seconds
            request.slo.tpot_seconds = self.slo.tpot_seconds
        return request

    def params(self) -> dict[str, str]:
        """Validator field -> this body's parameter, where the names differ (for errors)."""
        if self.structured_outputs is not None:
            return {}  # `structured.<field>` -> `structured_outputs.<field>`: _PARAMS
        return {
            "sampling.structured.json": "response_format.json_schema.schema",
            "sampling.structured.json_object": "response_format",
        }

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    """`POST /v1/completions`: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = None

    def to_generate_request(self) -> generation_pb2.GenerateRequest:
        if self.echo:
            raise InvalidRequestError("echo", "not supported")
        if self.logprobs is not None:
            raise InvalidRequestError("logprobs", "not supported")
        request = self.request()
        if isinstance(self.prompt, str):
            request.prompt = self.prompt
            return request
        token_ids = [token for token in self.prompt if isinstance(token, int)]
        if len(token_ids) != len(self.prompt):
            raise InvalidRequestError("prompt", "one prompt per request (not a list of texts)")
        request.prompt_token_ids.ids.extend(token_ids)
        return request


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def to_chat_message(self) -> ChatMessage:
        if isinstance(self.content, str):
            return ChatMessage(self.role, self.content)
        return ChatMessage(self.role, "".join(part.text for part in self.content))


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`: messages, rendered by the model's chat template."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False

    def _max_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS

    def params(self) -> dict[str, str]:
        names = {"prompt": "messages"}
        if self.max_completion_tokens is not None:
            names["sampling.max_tokens"] = "max_completion_tokens"
        return names

    def chat_messages(self) -> list[ChatMessage]:
        if self.logprobs:
            raise InvalidRequestError("logprobs", "not supported")
        return [message.to_chat_message() for message in self.messages]

    def to_generate_request(self, prompt: str) -> generation_pb2.GenerateRequest:
        request = self.request()
        request.prompt = prompt
        return request


def _format_constraint(
    response_format: ResponseFormat | None,
) -> common_pb2.StructuredOutputs | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return common_pb2.StructuredOutputs(json_object=True)
    described = response_format.json_schema
    if described is None or described.schema_ is None:
        raise InvalidRequestError(
            "response_format.json_schema.schema", "a json_schema response format needs a schema"
        )
    return common_pb2.StructuredOutputs(json=json.dumps(described.schema_))
