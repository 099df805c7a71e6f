"""Sampling parameters between pdserve.v1 messages and core types, for the router and both tiers.

Torch-free: the router imports it. Zero values of the proto select the documented defaults (proto3
cannot tell unset from zero). Errors are InvalidRequestError whose field names follow the proto
(`sampling.max_tokens`).
"""

from __future__ import annotations

from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
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
    return message
