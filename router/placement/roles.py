"""Role-flexible workers: a prefill worker's role is a preference the router changes at run time.

Every worker can run a request end to end (a prefill worker serves Decode.GenerateLocal too), so
a tier is where a worker is deployed and what it prefers, not all it can do. Under
`--placement adaptive` the router

    lends an idle prefill worker streams    role prefill -> decode: it joins the decode pool as a
                                             borrowed worker (its own channel, Decode stub,
                                             Load polls), chosen by the cost model like any other
    takes it back once its streams are done role decode -> prefill: it leaves the decode pool;
                                             calls still in flight there run to their end

A lent worker keeps prefilling for the decode tier meanwhile (the cost model prices the stall on
its streams). Reserve never goes to a lent worker: only the decode tier receives KV. The tiers,
their flags, Deployments and HPAs stay as they are.

`worker_states` is what the adaptive placement reads: each worker's last Load report plus what
this router sent it since (streams, prompts and their tokens), the two views of a lent worker
(prefill and decode pool) merged into one.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from pdserve.core.serving.step_window_proto import step_windows_from_proto
from pdserve.router import metrics
from pdserve.router.config import Tier
from pdserve.router.placement.adaptive import WorkerRole, WorkerState
from pdserve.router.registry import NoHealthyWorkerError, Registry
from pdserve.router.worker import Worker
from pdserve.v1 import common_pb2

if TYPE_CHECKING:
    from pdserve.v1.decode_pb2_grpc import DecodeAsyncStub

log = logging.getLogger(__name__)


class Roles:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def lent(self) -> set[str]:
        return set(self.registry.decode.borrowed)

    def decode_worker(self, address: str) -> Worker[DecodeAsyncStub]:
        """The decode pool's worker at `address`, lending it first if it is a prefill worker."""
        pool = self.registry.decode
        if address in pool.workers and not pool.workers[address].removed:
            return pool.workers[address]
        lender = self.registry.prefill.workers[address]
        worker = pool.borrow(address)
        # Healthy as the prefill pool saw it; its own Load polls take over from the next round.
        worker.healthy, worker.report = lender.healthy, lender.report
        metrics.ROLE_CHANGES.labels(WorkerRole.DECODE.value).inc()
        log.info("prefill worker %s lent to decode", address)
        return worker

    def take_back_idle(self) -> None:
        """Lent workers with no stream left (by their last report and this router's calls)
        return to the prefill role."""
        decode, prefill = self.registry.decode, self.registry.prefill
        for address in list(decode.borrowed):
            view = decode.workers.get(address)
            busy = view is not None and (view.in_flight or _running(view))
            lender = prefill.workers.get(address)
            if busy or (lender is not None and _running(lender)):
                continue
            decode.give_back(address)
            metrics.ROLE_CHANGES.labels(WorkerRole.PREFILL.value).inc()
            log.info("prefill worker %s back to prefill", address)

    def worker_states(self, avoid: Collection[str] = ()) -> list[WorkerState]:
        """Every usable worker as the placement sees it; workers in `avoid` (lost mid-request)
        are left out unless no decode-capable worker would remain."""
        lent = self.lent()
        states = [
            _state(w, WorkerRole.DECODE, WorkerRole.DECODE, None)
            for w in _usable(self.registry.decode.workers.values())
            if w.address not in lent
        ]
        views = self.registry.decode.workers
        for worker in _usable(self.registry.prefill.workers.values()):
            role = WorkerRole.DECODE if worker.address in lent else WorkerRole.PREFILL
            states.append(_state(worker, WorkerRole.PREFILL, role, views.get(worker.address)))
        if not any(s.tier is WorkerRole.DECODE for s in states):
            raise NoHealthyWorkerError(Tier.DECODE)  # as the threshold rule's pick would
        kept = [s for s in states if s.address not in avoid]
        decoding = [s for s in kept if s.tier is WorkerRole.DECODE]
        return kept if decoding else states


def _usable(workers: Collection[Worker[Any]]) -> list[Worker[Any]]:
    return [w for w in workers if w.serving]


def _running(worker: Worker[Any]) -> bool:
    """Streams or prompts by its last report, or sent since (a prompt counted at the decision,
    before its call starts: the worker is not taken back under a request about to run)."""
    report = worker.report or common_pb2.LoadResponse()
    sent = worker.dispatched_since_poll or worker.sent_prompts.count
    return bool(report.num_running or report.num_waiting or sent)


def _state(
    worker: Worker[Any], tier: WorkerRole, role: WorkerRole, view: Worker[Any] | None
) -> WorkerState:
    """`worker`'s report and this router's sends since; `view`: its decode-pool twin (lent)."""
    report = worker.report or common_pb2.LoadResponse()
    both = [worker] if view is None else [worker, view]
    return WorkerState(
        address=worker.address,
        tier=tier,
        role=role,
        running=report.num_running + _streams_sent(worker, tier, view),
        context_tokens=report.num_context_tokens,
        pending_prompts=report.num_waiting + sum(w.sent_prompts.count for w in both),
        pending_prompt_tokens=report.num_pending_prompt_tokens
        + sum(w.sent_prompts.tokens for w in both),
        step_windows=tuple(step_windows_from_proto(report.step_windows)),
        step_cap_s=report.step_cap_seconds,
    )


def _streams_sent(worker: Worker[Any], tier: WorkerRole, view: Worker[Any] | None) -> int:
    """Streams this router sent to `worker`'s decode-pool view since its last report. A local
    request is counted there both as a call and as a prompt; until it reports, it counts as the
    prompt only (as the worker's own report does while the prompt is computed:
    core/sched/engine_load.py). A prefill worker's own calls are Prefill calls: prompts only."""
    pool_view = view if view is not None else worker if tier is WorkerRole.DECODE else None
    if pool_view is None:
        return 0
    return max(pool_view.dispatched_since_poll - pool_view.sent_prompts.count, 0)
