"""One Load poll of one worker, read as health: answered (healthy), late (slow: busy, not
dead), refused (dead: out at once), wedged (its engine on one step for --engine-stall-seconds),
or silent for as long as keepalive gives a vanished peer (given up: its streams fail over).

Keepalive alone does not always find a vanished worker: a pod cut off under load once held its
streams for over a minute (gRPC core can queue its pings behind writes that never leave; grpc/grpc
issue 14717), so the poll's own silence gives it up too. The pool that polls (router/registry.py)
takes the report and fails the streams of a worker this says is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc

from pdserve.router.config import RouterConfig, Tier
from pdserve.router.worker import StubT, Worker
from pdserve.v1 import common_pb2

log = logging.getLogger(__name__)

FAILED_POLLS_TO_UNHEALTHY = 3  # Load timeouts in a row before a worker is skipped


@dataclass(frozen=True)
class HealthLimits:
    load_timeout_s: float  # a Load answer later than this failed the poll
    stall_s: float  # one engine step longer than this: wedged (0: never)
    silence_s: float  # nothing heard for longer: given up (keepalive time + timeout)

    @classmethod
    def of(cls, config: RouterConfig) -> HealthLimits:
        keepalive = config.keepalive
        return cls(
            config.load_timeout_seconds,
            config.engine_stall_seconds,
            keepalive.time_seconds + keepalive.timeout_seconds,
        )


@dataclass(frozen=True)
class PollOutcome:
    report: common_pb2.LoadResponse | None  # a fresh load to take (None: nothing to take)
    lost: bool = False  # given up by this poll: its streams fail over (once, until it answers)


async def poll_health(worker: Worker[StubT], tier: Tier, limits: HealthLimits) -> PollOutcome:
    """Polls `worker`'s Load and updates its health flags (healthy, slow, failed_polls,
    given_up, leaving) from the answer or its absence."""
    try:
        report = await worker.stub.Load(common_pb2.LoadRequest(), timeout=limits.load_timeout_s)
    except asyncio.CancelledError:
        if _this_task_is_cancelled():
            raise
        return PollOutcome(None)  # the worker left and its channel closed under the call
    except grpc.aio.AioRpcError as error:
        _count_failure(worker, tier, error)
        return PollOutcome(None, lost=_given_up_if_silent(worker, tier, limits.silence_s))
    worker.heard_from()
    worker.given_up = False
    _note_draining(worker, report)
    if limits.stall_s and report.step_running_seconds > limits.stall_s:
        return PollOutcome(None, lost=_wedged(worker, tier, report))
    if not worker.healthy:
        log.info("%s worker %s healthy", tier.value, worker.address)
    worker.healthy, worker.slow, worker.failed_polls = True, False, 0
    return PollOutcome(report)


def _count_failure(worker: Worker[StubT], tier: Tier, error: grpc.aio.AioRpcError) -> None:
    """A refused connection is a dead (or not yet started) process: out at once. A slow answer
    may be a busy one (a long engine step holds its event loop): out only after several in a
    row, or one loaded moment would fail every request."""
    worker.failed_polls += 1
    dead = error.code() == grpc.StatusCode.UNAVAILABLE
    if worker.healthy and (dead or worker.failed_polls >= FAILED_POLLS_TO_UNHEALTHY):
        log.warning("%s worker %s unhealthy: %s", tier.value, worker.address, error)
        worker.healthy = False
    worker.slow = not dead and not worker.healthy and not worker.given_up


def _wedged(worker: Worker[StubT], tier: Tier, report: common_pb2.LoadResponse) -> bool:
    """A worker whose engine has been on one step too long answers Load (its gRPC server runs
    apart) but moves none of its streams: unhealthy until a report shows it stepping again.
    Whether this report is the first such (its streams fail over then)."""
    first = worker.healthy or worker.slow
    if first:
        log.warning(
            "%s worker %s wedged: one engine step running for %.0f s; failing its streams over",
            tier.value,
            worker.address,
            report.step_running_seconds,
        )
    worker.healthy, worker.slow = False, False
    return first


def _given_up_if_silent(worker: Worker[StubT], tier: Tier, silence_s: float) -> bool:
    """A worker that answered once and then nothing for `silence_s` is lost, as keepalive would
    have found it: once, until it answers again. Whether this poll gave it up."""
    answered = worker.answered_at
    if worker.given_up or answered is None:
        return False
    silent = time.monotonic() - answered
    if silent <= silence_s:
        return False
    log.warning(
        "%s worker %s silent for %.1f s (no Load answer): failing its streams over",
        tier.value,
        worker.address,
        silent,
    )
    worker.given_up = True
    worker.healthy, worker.slow = False, False
    worker.leaving.set()  # prompts queued for it go elsewhere (remote_prefill.py)
    return True


def _note_draining(worker: Worker[StubT], report: common_pb2.LoadResponse) -> None:
    if report.draining and not worker.leaving.is_set():
        log.info("worker %s drains", worker.address)
        worker.leaving.set()
    elif not report.draining and not worker.removed:
        worker.leaving.clear()


def _this_task_is_cancelled() -> bool:
    """Whether the running task itself is being cancelled: grpc also raises CancelledError in a
    call whose channel was closed, which must not end the task awaiting it (the poll loop)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
