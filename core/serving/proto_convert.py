"""Conversions between pdserve.v1 messages and core types, shared by every service.

Zero values of the proto select the documented defaults (proto3 cannot tell unset from zero).
Errors are InvalidRequestError whose field names follow the proto (`sampling.max_tokens`).
"""

from __future__ import annotations

from pdserve.core.kv_cache import KVLayout
from pdserve.core.outputs import FinishReason
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.transfer.interface import TransferDescriptor
from pdserve.v1 import common_pb2

DEFAULT_MAX_TOKENS = SamplingParams().max_tokens

_FINISH_REASONS = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORTED: common_pb2.FINISH_REASON_ABORTED,
}
_FINISH_REASONS_BACK = {value: key for key, value in _FINISH_REASONS.items()}


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


def finish_reason_to_proto(reason: FinishReason | None) -> common_pb2.FinishReason.ValueType:
    if reason is None:
        return common_pb2.FINISH_REASON_UNSPECIFIED
    return _FINISH_REASONS[reason]


def finish_reason_from_proto(value: common_pb2.FinishReason.ValueType) -> FinishReason | None:
    return _FINISH_REASONS_BACK.get(value)


def layout_to_proto(layout: KVLayout) -> common_pb2.KVLayout:
    return common_pb2.KVLayout(
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        block_size=layout.block_size,
        dtype=layout.dtype,
    )


def layout_from_proto(message: common_pb2.KVLayout) -> KVLayout:
    return KVLayout(
        num_layers=message.num_layers,
        num_kv_heads=message.num_kv_heads,
        head_dim=message.head_dim,
        block_size=message.block_size,
        dtype=message.dtype,
    )


def descriptor_to_proto(descriptor: TransferDescriptor) -> common_pb2.TransferDescriptor:
    return common_pb2.TransferDescriptor(
        request_id=descriptor.request_id,
        worker_address=descriptor.peer_address,
        block_ids=list(descriptor.block_ids),
        layout=layout_to_proto(descriptor.layout),
        transfer_token=descriptor.token,
        num_pieces=descriptor.num_pieces,
        num_cached_blocks=descriptor.num_cached_blocks,
    )


def descriptor_from_proto(message: common_pb2.TransferDescriptor) -> TransferDescriptor:
    return TransferDescriptor(
        request_id=message.request_id,
        peer_address=message.worker_address,
        block_ids=tuple(message.block_ids),
        layout=layout_from_proto(message.layout),
        token=message.transfer_token,
        num_pieces=message.num_pieces or 1,  # unset: one message, as before pieces existed
        num_cached_blocks=message.num_cached_blocks,
    )
