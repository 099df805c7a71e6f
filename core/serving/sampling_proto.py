"""Sampling parameters between pdserve.v1 messages and core types, for the router and both tiers.

Torch-free: the router imports it. Zero values of the proto select the documented defaults (proto3
cannot tell unset from zero). Errors are InvalidRequestError whose field names follow the proto
(`sampling.max_tokens`).
"""

from __future__ import annotations

from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.structured.params import StructuredOutputsParams
from pdserve.v1 import common_pb2

DEFAULT_MAX_TOKENS = SamplingParams().max_tokens


def sampling_from_proto(message: common_pb2.SamplingParams, priority: int) -> SamplingParams:
    """A validated SamplingParams; raises InvalidRequestError naming `sampling.<field>`."""
    top_p = message.top_p if message.top_p != 0 else 1.0
    try:
        return SamplingParams(
            max_tokens=message.max_tokens or DEFAULT_MAX_TOKENS,
            temperature=float(message.temperature),
            top_p=float(top_p),
            top_k=int(message.top_k),
            seed=int(message.seed) if message.HasField("seed") else None,
            stop=tuple(message.stop),
            stop_token_ids=tuple(message.stop_token_ids),
            ignore_eos=message.ignore_eos,
            priority=priority,
            n=message.n or 1,
            structured_outputs=_structured_from_proto(message),
        )
    except InvalidRequestError as error:
        field = error.field if error.field == "priority" else f"sampling.{error.field}"
        raise InvalidRequestError(field, str(error).split(": ", 1)[1]) from None


def sampling_to_proto(params: SamplingParams) -> common_pb2.SamplingParams:
    message = common_pb2.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        n=params.n,
    )
    if params.seed is not None:
        message.seed = params.seed
    if params.structured_outputs is not None:
        message.structured.CopyFrom(_structured_to_proto(params.structured_outputs))
    return message


def _structured_from_proto(message: common_pb2.SamplingParams) -> StructuredOutputsParams | None:
    if not message.HasField("structured"):
        return None
    structured = message.structured
    kind = structured.WhichOneof("constraint")
    if kind is None:
        raise InvalidRequestError("structured", "set one constraint (or leave it unset)")
    if kind == "choice":
        return StructuredOutputsParams(choice=tuple(structured.choice.options))
    return StructuredOutputsParams(**{kind: getattr(structured, kind)})


def _structured_to_proto(params: StructuredOutputsParams) -> common_pb2.StructuredOutputs:
    if params.choice is not None:
        return common_pb2.StructuredOutputs(choice=common_pb2.Choices(options=params.choice))
    if params.json_object:
        return common_pb2.StructuredOutputs(json_object=True)
    kind = params.kind.value
    return common_pb2.StructuredOutputs(**{kind: getattr(params, kind)})
