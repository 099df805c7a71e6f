"""Decode's reservations (Decode.Reserve) waiting for blocks: one queue, used by `DecodeEngine`
and by the simulator's decode workers alike, so that both grant the same reservations the same
blocks at the same turn.

A reservation asks for blocks to receive a prompt's KV into. Requests that already have a place in
the batch go first: while the scheduler has preempted, swapped or landed requests waiting to
(re)join it, nothing is granted (newcomers would take the blocks they wait for). Then
reservations are granted in arrival order, each taking its prompt's cached leading blocks by
reference and new blocks for the rest (`KVCacheManager.allocate_prompt`); the first that does not
fit waits, and everything behind it waits too. When the KV has landed, `kv_landed` counts the
prompt as computed, and its full blocks join the prefix cache for later reservations to reuse.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from pdserve.core.request import Request, RequestStatus
from pdserve.core.sched.scheduler import Scheduler


class Reservation(Protocol):
    """What the queue needs of a holder's reservation record: the request it reserves for."""

    @property
    def request(self) -> Request: ...


R = TypeVar("R", bound=Reservation)


class ReservationQueue(Generic[R]):
    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._queued: deque[R] = deque()

    def __len__(self) -> int:
        return len(self._queued)

    def __iter__(self) -> Iterator[R]:
        return iter(self._queued)

    def append(self, reservation: R) -> None:
        self._queued.append(reservation)

    def get(self, request_id: str) -> R | None:
        return next((r for r in self._queued if r.request.request_id == request_id), None)

    def remove(self, reservation: R) -> None:
        self._queued.remove(reservation)

    def grant(self, post: Callable[[R], bool]) -> None:
        """Grants queued reservations, in order, while the rules above allow. `post` hands each
        granted one (its request WAITING_FOR_KV, its blocks held, `num_computed_tokens` the
        cached prefix it took) to the holder, which returns whether it stands: decode posts the
        KV receive, and when that fails the blocks go back at once."""
        kv_manager = self._scheduler.kv_manager
        while self._queued and not self._scheduler.has_queued():
            reservation = self._queued[0]
            request = reservation.request
            if not kv_manager.allocate_prompt(request):
                return
            self._queued.popleft()
            request.status = RequestStatus.WAITING_FOR_KV
            if post(reservation):
                kv_manager.count_reservation(request)
            else:
                kv_manager.free_for_recompute(request)

    def kv_landed(self, request: Request) -> None:
        """The prompt's KV (and a migrated request's resumed output's) is in the request's
        blocks: it counts as computed and its full blocks join the prefix cache, so they outlive
        the request."""
        computed = request.num_computed_tokens
        self._scheduler.record_computed(request, request.num_tokens - computed)
