"""The prefill tier's engine: batch prompts, run them, sample the first token, ship the KV.

Prompts share steps under the token budget (long ones in chunks) exactly as in the offline engine;
the difference is what happens when a prompt completes. In the step where it completes, its
transfer is opened before the forward pass, and each group of layers (one piece of the descriptor)
is gathered and pushed over UCX into the blocks decode reserved as soon as the forward has written
that group's K/V, so the wire time overlaps the rest of the forward (only the blocks from the
descriptor's `first_block` travel: not those decode holds already, nor, for a sliding-window
model, those before the window of decode's first step); `_append` (after sampling)
pushes whatever is left and frees the blocks (every push copies before it returns), and the
caller's future resolves when decode has every piece.

A prompt added with `add_local` (Decode.GenerateLocal, served here too) has no transfer: it runs
end to end in the same batch, which is how the router lets an idle prefill worker decode.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.kv.sliding_window import first_live_block
from pdserve.core.outputs import FinishReason, TokenDelta
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from pdserve.core.sched.scheduler import SchedulerOutput
from pdserve.core.transfer.interface import (
    KVSenderLike,
    PieceSendLike,
    SendResult,
    TransferDescriptor,
    check_layout,
    layer_groups,
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
    sending: PieceSendLike | None = None  # opened in the step where the prompt completes
    failed: concurrent.futures.Future[SendResult] | None = None  # open() refused
    pushed: int = 0  # pieces pushed so far, in layer order
    groups: tuple[range, ...] = field(default_factory=tuple)

    def push_through(self, layer: int) -> None:
        """Pushes every piece whose last layer is `layer` or earlier."""
        assert self.sending is not None  # only opened jobs are pushed
        while self.pushed < len(self.groups) and self.groups[self.pushed][-1] <= layer:
            self.sending.push(self.pushed)
            self.pushed += 1

    def finish(self) -> concurrent.futures.Future[SendResult]:
        """Pushes what is left and returns the transfer's outcome (exactly once per job)."""
        if self.failed is not None:
            return self.failed
        assert self.sending is not None  # opened before the forward pass of this step
        self.push_through(self.groups[-1][-1])
        return self.sending.done()


class PrefillEngine(LLMEngine):
    def __init__(self, model_dir: Path, config: EngineConfig, sender: KVSenderLike) -> None:
        super().__init__(model_dir, config)
        self.sender = sender
        self._jobs: dict[str, _Job] = {}

    def close(self) -> None:
        self.sender.close()
        super().close()

    def submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        destination: TransferDescriptor,
        resumed_output: Sequence[int] = (),
    ) -> concurrent.futures.Future[PrefillOutcome]:
        """Queues a prompt (engine thread); the future resolves once decode has its KV: that of
        the prompt and of `resumed_output` (a migration, see `LLMEngine.resume`)."""
        check_layout(self.layout, destination.layout)  # LayoutMismatchError names both
        self._check_blocks(len(prompt_token_ids) + len(resumed_output), destination)
        if not 1 <= destination.num_pieces <= self.layout.num_layers:
            raise InvalidRequestError(
                "destination.num_pieces",
                f"{destination.num_pieces} pieces for {self.layout.num_layers} layers",
            )
        self.add_request(prompt_token_ids, params, request_id, resumed_output)
        job = _Job(destination, concurrent.futures.Future(), time.monotonic())
        self._jobs[request_id] = job
        return job.outcome

    def redirect(self, request_id: str, destination: TransferDescriptor) -> bool:
        """Points a queued prompt's KV at another reservation (engine thread): whether it now
        goes there. Too late once its transfer has opened (the step that completes the prompt):
        the first destination then gets it. The prompt keeps its place and what it computed."""
        job = self._jobs.get(request_id)
        if job is None or job.sending is not None or job.failed is not None:
            return False
        check_layout(self.layout, destination.layout)
        self._check_blocks(self.requests[request_id].num_tokens, destination)
        job.destination = destination
        return True

    def _check_blocks(self, num_tokens: int, destination: TransferDescriptor) -> None:
        """Decode holds the first `num_cached_blocks` blocks and needs none of the
        `num_slid_blocks` before its window (this model's: the blocks this engine keeps);
        `block_ids` must be the rest, and the block of the last prompt token always travels."""
        needed = blocks_for(num_tokens, self.config.block_size)
        cached = destination.num_cached_blocks
        if not 0 <= cached < needed:
            raise InvalidRequestError(
                "destination.num_cached_blocks",
                f"{cached} cached blocks for a {num_tokens}-token prompt (must be < {needed})",
            )
        slid = first_live_block(
            num_tokens, self.model_config.sliding_window, self.layout.block_size
        )
        if destination.num_slid_blocks != slid:
            raise InvalidRequestError(
                "destination.num_slid_blocks",
                f"{destination.num_slid_blocks} for a {num_tokens}-token prompt, but this "
                f"model's sliding window ({self.model_config.sliding_window}) passes {slid}",
            )
        first = destination.first_block
        if len(destination.block_ids) != needed - first:
            raise InvalidRequestError(
                "destination.block_ids",
                f"{len(destination.block_ids)} blocks for a {num_tokens}-token prompt from "
                f"block {first} (needs {needed - first})",
            )

    def abort(self, request_id: str) -> None:
        job = self._jobs.pop(request_id, None)
        if job is not None:
            job.outcome.cancel()
            if job.sending is not None:
                job.sending.done()  # releases its staging once the pushed pieces settle
        super().abort(request_id)

    def _may_draft(self, request: Request) -> bool:
        """A prompt prefilled for decode ends at its first token, exactly: drafts would carry
        its step past the prompt (a resumed one's context stops one token short of it when
        chunked, where a decoding request drafts) and its transfer would never open."""
        return request.request_id not in self._jobs

    def _after_layer(self, output: SchedulerOutput) -> Callable[[int], None] | None:
        """Opens the transfers of the prompts that complete this step; pushes their pieces as the
        forward pass writes each group's layers."""
        scheduled = output.num_scheduled_tokens.items()
        opened = [self._open(rid) for rid, num_new in scheduled if self._completes(rid, num_new)]
        pushing = [job for job in opened if job.sending is not None]
        if not pushing:
            return None

        def push(layer: int) -> None:
            for job in pushing:
                job.push_through(layer)

        return push

    def _completes(self, request_id: str, num_new: int) -> bool:
        request = self.requests[request_id]
        completes = request.num_computed_tokens + num_new == request.num_tokens
        return completes and request_id in self._jobs

    def _open(self, request_id: str) -> _Job:
        job, request = self._jobs[request_id], self.requests[request_id]
        try:
            skipped = job.destination.first_block  # decode holds or needs none before it
            job.sending = self.sender.open(
                job.destination,
                self.runner.kv_cache,
                request.block_ids[skipped:],
                request.num_tokens - skipped * self.config.block_size,
            )
            job.groups = layer_groups(self.layout.num_layers, job.destination.num_pieces)
        except Exception as error:  # this request fails alone; the step goes on
            job.failed = _failure(error)
        return job

    def _append(self, request: Request, token: int) -> TokenDelta:
        """The prompt is done: ship its KV, free its blocks, report the first token. A request
        run here end to end (`add_local`: the router lent this worker a stream) has no job and
        goes on decoding as in the offline engine."""
        job = self._jobs.pop(request.request_id, None)
        if job is None:
            return super()._append(request, token)
        sampled_at = time.monotonic()
        sending = job.finish()
        self.scheduler.finish(request, RequestStatus.FINISHED_LENGTH)
        self._forget(request.request_id)
        queue_seconds = (request.first_scheduled_time or sampled_at) - job.submitted
        sending.add_done_callback(
            lambda done: _resolve(job, token, done, queue_seconds, sampled_at - job.submitted)
        )
        return TokenDelta(request.request_id, (token,), "", FinishReason.LENGTH)

    def queue_depth(self) -> int:
        """Prompts not yet finished here (the autoscaling signal of this tier)."""
        return len(self._jobs)


def _failure(error: Exception) -> concurrent.futures.Future[SendResult]:
    failed: concurrent.futures.Future[SendResult] = concurrent.futures.Future()
    failed.set_exception(error)
    return failed


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
