"""Conversions between pdserve.v1 messages and the workers' core types: finish reasons, KV
layouts and transfer descriptors. Sampling parameters, which the router converts too, are in
sampling_proto.py (torch-free).
"""

from __future__ import annotations

from collections.abc import Iterable

from pdserve.core.kv.cache import KVLayout
from pdserve.core.outputs import FinishReason
from pdserve.core.sched.engine_load import EngineLoad
from pdserve.core.serving.step_window_proto import step_windows_to_proto
from pdserve.core.transfer.interface import TransferDescriptor
from pdserve.costmodel.correction import StepWindow
from pdserve.v1 import common_pb2

_FINISH_REASONS = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORTED: common_pb2.FINISH_REASON_ABORTED,
}
_FINISH_REASONS_BACK = {value: key for key, value in _FINISH_REASONS.items()}


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
        num_slid_blocks=descriptor.num_slid_blocks,
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
        num_slid_blocks=message.num_slid_blocks,
    )


def load_to_proto(
    load: EngineLoad,
    step_windows: Iterable[StepWindow],
    step_running_seconds: float,
    draining: bool,
) -> common_pb2.LoadResponse:
    """A worker's `Load` answer (both tiers answer the same way)."""
    return common_pb2.LoadResponse(
        draining=draining,
        step_windows=step_windows_to_proto(step_windows),
        step_running_seconds=step_running_seconds,
        num_waiting=load.num_waiting,
        num_running=load.num_running,
        num_free_blocks=load.num_free_blocks,
        num_total_blocks=load.num_total_blocks,
        num_cacheable_blocks=load.num_cacheable_blocks,
        num_context_tokens=load.num_context_tokens,
        num_pending_prompt_tokens=load.num_pending_prompt_tokens,
        step_cap_seconds=load.step_cap_s,
    )
