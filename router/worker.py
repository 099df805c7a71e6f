"""One worker as the router knows it: its channel and stub, its health, its last load report, and
whether it is leaving or was given up (router/registry.py keeps them per tier and polls them)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import grpc

from pdserve.router.placement.worker_choice import WorkerLoad
from pdserve.router.sent_prompts import SentPrompts
from pdserve.v1 import common_pb2


class LoadStub(Protocol):
    @property
    def Load(
        self,
    ) -> grpc.aio.UnaryUnaryMultiCallable[common_pb2.LoadRequest, common_pb2.LoadResponse]: ...


StubT = TypeVar("StubT", bound=LoadStub)


@dataclass(eq=False)
class Worker(Generic[StubT]):
    address: str
    channel: grpc.aio.Channel
    stub: StubT
    healthy: bool = False
    report: common_pb2.LoadResponse | None = None
    in_flight: int = 0
    dispatched_since_poll: int = 0
    failed_polls: int = 0  # in a row
    # Unhealthy only because its Load answers came late (a busy worker, not a dead one).
    slow: bool = False
    removed: bool = False
    # Set while it leaves (out of the targets, or its Load says it drains): it is not picked,
    # and prefills still queued for its reservations move elsewhere (remote_prefill.py).
    leaving: asyncio.Event = field(default_factory=asyncio.Event)
    answered_at: float | None = None  # time.monotonic() it was last heard from
    given_up: bool = False  # its streams were failed over; until it answers again
    # Prompts the router sent it to prefill that its load reports may not show yet.
    sent_prompts: SentPrompts = field(default_factory=SentPrompts)

    @property
    def staying(self) -> bool:
        """Neither removed nor leaving: it may be given new work."""
        return not (self.removed or self.leaving.is_set())

    @property
    def serving(self) -> bool:
        """Healthy and staying: counted as the tier's capacity."""
        return self.healthy and self.staying

    def heard_from(self) -> None:
        """Something came from it (a Load answer, a stream's delta): it is not silent."""
        self.answered_at = time.monotonic()

    def load(self) -> WorkerLoad:
        report = self.report or common_pb2.LoadResponse()
        return WorkerLoad(
            num_waiting=report.num_waiting,
            num_running=report.num_running,
            num_free_blocks=report.num_free_blocks,
            num_total_blocks=report.num_total_blocks,
            dispatched_since_poll=self.dispatched_since_poll,
        )
