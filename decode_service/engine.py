"""The decode tier's engine: reserve blocks, wait for KV over UCX, then continuous batching.

A request's path through decode (traced, as SGLang's disaggregation docs do):
1. `reserve` (Decode.Reserve): validates, takes blocks for the prompt's KV — or queues the
   reservation until blocks free up (bounded: a full queue is RESOURCE_EXHAUSTED) — and posts the
   UCX receive. Leading prompt blocks this worker's prefix cache holds are taken by reference
   (as the scheduler does for a fresh request) and left out of the descriptor's `block_ids`:
   `num_cached_blocks` tells prefill not to send them, and the receive expects only the rest.
   A sliding-window model's reservation holds no block before the window of its first decode
   step either (`num_slid_blocks`: prefill sends none of those).
   Status WAITING_FOR_KV; the request is in no scheduler queue yet. The queue and its rules are
   `core/sched/reservation_queue.py`'s, which the planner's simulator runs too.
2. `start` (Decode.Generate): the router hands over prefill's first token. From now on `poll`
   watches the transfer without blocking.
3. KV landed: the prompt's full blocks join the prefix cache (so they outlive the request), the
   first token is appended (it may already finish the request) and the request joins the
   scheduler's waiting queue with `num_computed_tokens = prompt length`, so its next step is a
   one-token decode. Preemption, swap and recompute then work as in the offline engine.
Reservations nobody claims within `reservation_ttl_s` (a router that died) are freed, and so are
transfers that do not land within `kv_timeout_s`.

Live migration (a draining worker moves its streams, docs/elasticity.md):
- here, the draining side: `suspend` takes a request out of the batch between two steps and ends
  its stream (`RequestSuspended`); `migration_out.py` keeps its blocks for `migrate`, which pushes
  them into another worker's reservation.
- there, the receiving side: `reserve(..., live_migration=True)` is a reservation for the prompt
  and the streamed output but its last token, whose KV the next step computes; `start` brings
  that last token, which joins the output without being sent again, and the request decodes on.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.core.errors import (
    KVNotArrivedError,
    QueueFullError,
    RequestSuspended,
    TransferTokenError,
    UnknownRequestError,
)
from pdserve.core.kv.cache import KVCache
from pdserve.core.outputs import TokenDelta
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import (
    DuplicateRequestError,
    InvalidRequestError,
    SamplingParams,
)
from pdserve.core.sched.engine_load import EngineLoad
from pdserve.core.sched.reservation_queue import ReservationQueue
from pdserve.core.transfer.interface import (
    KVReceiverLike,
    SendResult,
    TransferDescriptor,
    TransferState,
)
from pdserve.decode_service.migration_out import OutgoingMigrations, SenderFactory

ReceiverFactory = Callable[[KVCache], KVReceiverLike]
Delivery = tuple[str, TokenDelta | BaseException]


class Suspension(enum.Enum):
    """What `suspend` did with a request."""

    NOT_RUNNING = "not_running"  # unknown here, finished, or with forks pending: left alone
    KV_READY = "kv_ready"  # out of the batch, its KV held for `migrate`
    KV_FREED = "kv_freed"  # out of the batch, its KV incomplete on the device and freed


@dataclass(frozen=True)
class DecodeLimits:
    max_pending_reservations: int = 256
    reservation_ttl_s: float = 120.0
    kv_timeout_s: float = 60.0


@dataclass
class _Reservation:
    request: Request
    granted: concurrent.futures.Future[TransferDescriptor]
    since: float
    descriptor: TransferDescriptor | None = None
    first_token: int | None = None  # set by `start`: from then on the transfer is polled
    live: bool = False  # a live migration's: `first_token` was streamed by the worker it left


class DecodeEngine(LLMEngine):
    streams_move_on_drain = True

    def __init__(
        self,
        model_dir: Path,
        config: EngineConfig,
        receiver_factory: ReceiverFactory,
        limits: DecodeLimits = DecodeLimits(),
        sender_factory: SenderFactory | None = None,
    ) -> None:
        super().__init__(model_dir, config)
        self.limits = limits
        self.receiver = receiver_factory(self.runner.kv_cache)
        self._queued = ReservationQueue[_Reservation](self.scheduler)  # waiting for blocks
        self._reserved: dict[str, _Reservation] = {}  # blocks held, KV expected
        self._failed: dict[str, str] = {}  # freed before Generate came: request id -> why
        self.outgoing = OutgoingMigrations(  # out of the batch, waiting for `migrate`
            self.scheduler.kv_manager,
            self.runner.kv_cache,
            config.block_size,
            sender_factory,
            limits.reservation_ttl_s,
        )
        self._outbox: list[Delivery] = []  # deliveries made between polls (suspended streams)

    def close(self) -> None:
        self.receiver.close()
        self.outgoing.close()
        super().close()

    # -- commands (engine thread) ---------------------------------------------------------

    def reserve(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        resumed_output: Sequence[int] = (),
        live_migration: bool = False,
    ) -> concurrent.futures.Future[TransferDescriptor]:
        """Validates now; the future resolves once blocks are held and the receive is posted.
        The KV expected is that of the prompt and `resumed_output` (a migration, see `resume`);
        with `live_migration` the first token `start` brings was streamed already too."""
        self._check_new(request_id)
        request = self._checked_request(request_id, prompt_token_ids, params, resumed_output)
        resumed = request.output_token_ids
        if live_migration and len(resumed) + 1 >= params.max_tokens:
            raise InvalidRequestError(
                "resumed_output_token_ids",
                f"{len(resumed)} tokens and the first leave none of max_tokens "
                f"({params.max_tokens}) to a live migration",
            )
        if len(self._queued) >= self.limits.max_pending_reservations:
            raise QueueFullError("decode: the reservation queue is full")
        reservation = _Reservation(
            request, concurrent.futures.Future(), time.monotonic(), live=live_migration
        )
        self._queued.append(reservation)
        self._grant_queued()
        return reservation.granted

    def add_local(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        resumed_output: Sequence[int] = (),
    ) -> None:
        """As `LLMEngine.add_local`, refusing an id a reservation here already holds."""
        self._check_new(request_id)
        super().add_local(request_id, prompt_token_ids, params, resumed_output)

    def _check_new(self, request_id: str) -> None:
        if self._knows(request_id):
            raise DuplicateRequestError(request_id)
        self._failed.pop(request_id, None)  # a retry of a failed reservation starts afresh

    def _knows(self, request_id: str) -> bool:
        queued = self._queued.get(request_id) is not None
        held = request_id in self._reserved or request_id in self.outgoing
        return queued or held or request_id in self.requests

    def start(self, request_id: str, token: bytes, first_token: int) -> None:
        """Prefill is done: watch for the KV and continue from `first_token`."""
        reservation = self._reserved.get(request_id)
        if request_id in self._failed:
            why = self._failed.pop(request_id)
            raise KVNotArrivedError(f"request {request_id!r}: its reservation was freed: {why}")
        if reservation is None or reservation.descriptor is None:
            raise UnknownRequestError(f"request_id: {request_id!r} has no reservation here")
        if reservation.descriptor.token != token:
            raise TransferTokenError(f"transfer_token: does not match request {request_id!r}")
        if not 0 <= first_token < self.model_config.vocab_size:
            raise InvalidRequestError("first_token_id", f"{first_token} is outside the vocabulary")
        grammar = reservation.request.grammar
        if grammar is not None and not grammar.allowed_prefix([first_token]):
            raise InvalidRequestError(
                "first_token_id", f"{first_token} is refused by the grammar of `structured`"
            )
        reservation.first_token = first_token
        reservation.since = time.monotonic()

    def abort(self, request_id: str) -> None:
        """Frees whatever the request holds, at any stage (unknown ids are ignored)."""
        self._failed.pop(request_id, None)
        if self.outgoing.abort(request_id):
            return
        queued = self._queued.get(request_id)
        if queued is not None:
            self._queued.remove(queued)
            queued.granted.cancel()
        if request_id in self._reserved:
            reservation = self._reserved.pop(request_id)
            self.receiver.cancel(request_id)
            self.scheduler.kv_manager.free_for_recompute(reservation.request)
            reservation.request.status = RequestStatus.FINISHED_ABORTED
            self._forget(request_id)
            return
        super().abort(request_id)

    # -- background work (the engine loop polls this between steps) -----------------------

    def pending(self) -> bool:
        return bool(self._queued or self._reserved or self._outbox) or self.outgoing.pending()

    def poll(self) -> list[Delivery]:
        self._grant_queued()
        deliveries, self._outbox = self._outbox, []
        now = time.monotonic()
        self.outgoing.expire(now)
        for request_id, reservation in list(self._reserved.items()):
            # Polled before Generate too: bytes land as soon as they arrive, and a failed
            # transfer (prefill died mid-send) frees its blocks at once, not at the TTL.
            state = self.receiver.poll(request_id)
            if reservation.first_token is None:
                expired = now - reservation.since > self.limits.reservation_ttl_s
                if state is TransferState.FAILED or expired:
                    self._fail(request_id, "its KV transfer failed" if not expired else "expired")
                continue
            if state is TransferState.DONE:
                delta = self._admit(reservation)
                if delta is not None:
                    deliveries.append((request_id, delta))
            elif (
                state is TransferState.FAILED or now - reservation.since > self.limits.kv_timeout_s
            ):
                self.abort(request_id)
                error = KVNotArrivedError(f"request {request_id!r}: its KV never arrived")
                deliveries.append((request_id, error))
        return deliveries

    def _fail(self, request_id: str, why: str) -> None:
        """Frees a reservation nobody started; a late Generate learns why (KVNotArrivedError)."""
        self.abort(request_id)
        self._failed[request_id] = why
        while len(self._failed) > self.limits.max_pending_reservations:
            self._failed.pop(next(iter(self._failed)))  # oldest first: bounded memory

    def _grant_queued(self) -> None:
        self._queued.grant(self._post_receive)

    def _post_receive(self, reservation: _Reservation) -> bool:
        """A granted reservation: posts the receive into the blocks its prefix cache lacks and
        answers the caller; whether that worked (if not, the caller learns why)."""
        request = reservation.request
        num_cached = request.num_computed_tokens // self.config.block_size
        num_slid = self.scheduler.kv_manager.num_slid_blocks(request)  # out of the window
        try:
            expected = self.receiver.expect(
                request.request_id, request.block_ids[max(num_cached, num_slid) :], self.layout
            )
        except Exception as error:
            reservation.granted.set_exception(error)
            return False
        descriptor = dataclasses.replace(
            expected, num_cached_blocks=num_cached, num_slid_blocks=num_slid
        )
        reservation.descriptor = descriptor
        reservation.since = time.monotonic()
        self._reserved[request.request_id] = reservation
        reservation.granted.set_result(descriptor)
        return True

    @property
    def saved_kv_bytes(self) -> int:
        """KV bytes that did not travel because this worker held the blocks already."""
        return self.scheduler.kv_manager.num_reused_blocks * int(self.layout.block_nbytes)

    def _admit(self, reservation: _Reservation) -> TokenDelta | None:
        """The KV landed: the request joins the batch; the delta of its first token (None for a
        live migration, whose first token the client has)."""
        request = reservation.request
        assert reservation.first_token is not None  # only started reservations are polled
        del self._reserved[request.request_id]
        self.receiver.cancel(request.request_id)  # forgets the finished transfer
        self._queued.kv_landed(request)
        self._track(request)
        # Same seed, same tokens as a single-process run: prefill drew the first token's noise
        # (and a migrated request's resumed output was sampled before that).
        resumed = request.output_token_ids
        if reservation.live:
            # The last token the draining worker streamed: output already, like the rest, and
            # the next step computes its KV, as it would have there.
            continued = [*resumed, reservation.first_token]
            self.resume(request, continued, tokens_sampled_elsewhere=len(continued))
            self.scheduler.add(request)
            return None
        self.resume(request, resumed, tokens_sampled_elsewhere=len(resumed) + 1)
        delta = self._append(request, reservation.first_token)
        if not delta.finished:
            self.scheduler.add(request)
        return delta

    def release(self, request_id: str) -> bool:
        """Aborts the request; whether it was known here."""
        known = self._knows(request_id)
        self.abort(request_id)
        return known

    def token_counts(self, request_id: str) -> tuple[int, int]:
        """(prompt tokens, output tokens already counted: a migration's resumed output) of a
        started reservation, for the usage its stream ends with."""
        reservation = self._reserved[request_id]
        request = reservation.request
        return request.num_prompt_tokens, len(request.output_token_ids) + int(reservation.live)

    def load(self) -> EngineLoad:
        """The engine's load, with reservations (queued or waiting for their KV) as waiting."""
        load = super().load()
        reservations = len(self._queued) + len(self._reserved)
        return dataclasses.replace(load, num_waiting=load.num_waiting + reservations)

    # -- live migration out (a draining worker) -------------------------------------------

    def suspend(self, request_id: str) -> Suspension:
        """Takes a request out of the batch between two steps; its stream ends here (after every
        token it produced) and its KV waits for `migrate` when it is all on the device."""
        request = self.requests.get(request_id)
        if request is None or request.forks or request.status.finished:
            return Suspension.NOT_RUNNING
        kv_ready = (
            request.status is RequestStatus.RUNNING
            and bool(request.output_token_ids)
            and not request.swap_block_ids
            and request.num_computed_tokens == request.num_tokens - 1
        )
        self.scheduler.detach(request)
        if not kv_ready:
            self.scheduler.kv_manager.free_for_recompute(request)
        self._forget(request_id)
        self.outgoing.hold(request, kv_ready)
        self._outbox.append((request_id, RequestSuspended(request_id)))
        return Suspension.KV_READY if kv_ready else Suspension.KV_FREED

    def migrate(
        self, request_id: str, destination: TransferDescriptor
    ) -> concurrent.futures.Future[SendResult]:
        """Pushes a suspended request's KV into `destination` (another worker's live-migration
        reservation) and frees it here; the future settles when the other worker took it all."""
        return self.outgoing.migrate(request_id, destination)
