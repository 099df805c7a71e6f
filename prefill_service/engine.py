"""The prefill tier's engine: batch prompts, run them, sample the first token, ship the KV.

Prompts share steps under the token budget (long ones in chunks) exactly as in the offline engine;
the difference is what happens when a prompt completes: its blocks are gathered into a staging
buffer and pushed over UCX into the blocks decode reserved (`KVSender.send` copies before it
returns, so the blocks are freed at once), and the caller's future resolves when decode has the
bytes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.core.outputs import FinishReason, TokenDelta
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.scheduler import blocks_for
from pdserve.core.transfer.interface import (
    KVSenderLike,
    SendResult,
    TransferDescriptor,
    check_layout,
)


@dataclass(frozen=True)
class PrefillOutcome:
    first_token_id: int
    kv_bytes_sent: int
    queue_seconds: float
    prefill_seconds: float
    transfer_seconds: float


@dataclass
class _Job:
    destination: TransferDescriptor
    outcome: concurrent.futures.Future[PrefillOutcome]
    submitted: float


class PrefillEngine(LLMEngine):
    def __init__(self, model_dir: Path, config: EngineConfig, sender: KVSenderLike) -> None:
        super().__init__(model_dir, config)
        self.sender = sender
        self._jobs: dict[str, _Job] = {}

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        destination: TransferDescriptor,
    ) -> concurrent.futures.Future[PrefillOutcome]:
        """Queues a prompt (engine thread); the future resolves once decode has its KV."""
        check_layout(self.layout, destination.layout)  # LayoutMismatchError names both
        needed = blocks_for(len(prompt_token_ids), self.config.block_size)
        if len(destination.block_ids) != needed:
            raise InvalidRequestError(
                "destination.block_ids",
                f"{len(destination.block_ids)} blocks for a {len(prompt_token_ids)}-token prompt "
                f"(needs {needed})",
            )
        self.add_request(prompt_token_ids, params, request_id)
        job = _Job(destination, concurrent.futures.Future(), time.monotonic())
        self._jobs[request_id] = job
        return job.outcome

    def abort(self, request_id: str) -> None:
        job = self._jobs.pop(request_id, None)
        if job is not None:
            job.outcome.cancel()
        super().abort(request_id)

    def _append(self, request: Request, token: int) -> TokenDelta:
        """The prompt is done: ship its KV, free its blocks, report the first token."""
        job = self._jobs.pop(request.request_id)
        sampled_at = time.monotonic()
        try:
            sending = self.sender.send(
                job.destination, self.runner.kv_cache, request.block_ids, request.num_prompt_tokens
            )
        except Exception as error:  # this request fails alone; the step goes on
            sending = concurrent.futures.Future()
            sending.set_exception(error)
        self.scheduler.finish(request, RequestStatus.FINISHED_LENGTH)
        del self.requests[request.request_id], self._detokenizers[request.request_id]
        queue_seconds = (request.first_scheduled_time or sampled_at) - job.submitted
        sending.add_done_callback(
            lambda done: _resolve(job, token, done, queue_seconds, sampled_at - job.submitted)
        )
        return TokenDelta(request.request_id, (token,), "", FinishReason.LENGTH)

    def queue_depth(self) -> int:
        """Prompts not yet finished here (the autoscaling signal of this tier)."""
        return len(self._jobs)


def _resolve(
    job: _Job,
    token: int,
    sending: concurrent.futures.Future[SendResult],
    queue_seconds: float,
    until_sampled: float,
) -> None:
    error = sending.exception()
    # The engine thread may cancel the outcome (an abort) at any moment, even between a check
    # and the set: a cancelled outcome simply keeps its cancel.
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            job.outcome.set_exception(error)
            return
        result = sending.result()
        job.outcome.set_result(
            PrefillOutcome(
                first_token_id=token,
                kv_bytes_sent=result.nbytes,
                queue_seconds=queue_seconds,
                prefill_seconds=until_sampled - queue_seconds,
                transfer_seconds=result.seconds,
            )
        )
