"""`StepWindow` (costmodel/correction.py) to and from its message in a worker's Load answer.
Torch-free: the workers write it, the router reads it."""

from __future__ import annotations

from collections.abc import Iterable

from pdserve.costmodel.correction import StepPhase, StepWindow
from pdserve.costmodel.step_shape import StepShape
from pdserve.v1 import common_pb2

_PHASES = {
    StepPhase.PREFILL: common_pb2.STEP_PHASE_PREFILL,
    StepPhase.DECODE: common_pb2.STEP_PHASE_DECODE,
    StepPhase.MIXED: common_pb2.STEP_PHASE_MIXED,
}
_PHASES_BACK = {value: key for key, value in _PHASES.items()}


def step_windows_to_proto(windows: Iterable[StepWindow]) -> list[common_pb2.StepWindow]:
    return [
        common_pb2.StepWindow(
            phase=_PHASES[window.phase],
            steps=window.steps,
            prefill_tokens=window.work.prefill_tokens,
            prefill_pairs=window.work.prefill_pairs,
            decode_seqs=window.work.decode_seqs,
            decode_context=window.work.decode_context,
            seconds=window.seconds,
        )
        for window in windows
    ]


def step_windows_from_proto(messages: Iterable[common_pb2.StepWindow]) -> list[StepWindow]:
    """The windows of a Load answer; one with a phase this version does not know is skipped."""
    return [
        StepWindow(
            _PHASES_BACK[message.phase],
            message.steps,
            StepShape(
                prefill_tokens=message.prefill_tokens,
                prefill_pairs=message.prefill_pairs,
                decode_seqs=message.decode_seqs,
                decode_context=message.decode_context,
            ),
            message.seconds,
        )
        for message in messages
        if message.phase in _PHASES_BACK
    ]
