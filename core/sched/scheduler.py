"""Iteration-level scheduling over a paged KV pool (vLLM v1 style), with preemption and swap.

Each request has `num_computed_tokens` and catches up to `num_tokens` (prompt + output so far):
a prefill is just a request that is far behind, a decode one that is a single token behind, so
prefill chunks and decodes share every step under one token budget. A step:

1. Running requests, best first, each get their next tokens (one for a decode, a chunk for a
   prefill). When blocks run out, the worst running request (lowest priority, latest arrival) is
   preempted: its blocks are swapped to the CPU pool if it has room, else freed for recompute.
2. Swapped and waiting requests, best first, are admitted while budget, `max_num_seqs` and blocks
   allow (step 1's prompt chunks leave a token for each queued request one token behind: decodes
   first, `_decodes_joining`); under `priority` one may preempt worse running ones. A fresh
   request first takes the leading blocks cached for its tokens
   (`KVCacheManager.take_cached_prefix`) and allocates only the rest.

After the forward, `record_computed` advances each request and registers the blocks it filled, so
later requests (and its own recompute after a preemption) can reuse them; with a sliding window
it also gives back the blocks no future query of the request can see (`KVCacheManager.slide`).

Speculative decoding: a request may carry drafted tokens (`Request.draft_token_ids`, set by the
engine's speculator before the step). Once everything else is scheduled, each request that
catches up this step verifies its drafts in the same forward, in what is left of the token
budget and the free blocks: drafts never preempt anyone nor keep a request out. After the
forward, `record_verified` advances it only by the tokens whose KV the target confirmed and
rolls back the rest (`KVCacheManager.roll_back`), so the prefix cache never sees a rejected
draft.

Blocks are the KV-cache manager's (`core/kv/manager.py`): the scheduler decides who gets
them and when; the manager gives, shares, copies, swaps and frees them and counts prefix hits.

With n > 1 the samples of a prompt share its blocks: the first computes all but the last prompt
token, then `_fork` gives every other sample a reference on each block. A request about to write
into a block others hold gets a private copy first (copy-on-write; only the partly filled last
block is ever written, full blocks stay shared).

The runner copies in this order: swap-out, copy-on-write, swap-in, forward. So device blocks
released by a swap-out can be reused at once (they are read before anything writes them); a
copy's source is read before any swap-in or forward can overwrite it, and a request swapped out
right after its copy-on-write swaps out the copy's source instead (`StepPlan.cancel_copies`). Swap
blocks released by a swap-in go back to the swap pool only at the next step
(`KVCacheManager.release_swapped_in`: a swap-out earlier in the same step's copies would
otherwise overwrite them before they are read).
"""

from __future__ import annotations

from pdserve.core.config import EngineConfig, SchedulingPolicy
from pdserve.core.kv.manager import KVCacheManager
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sched.fair_share import TenantCounters
from pdserve.core.sched.step_plan import (
    SchedulerOutput as SchedulerOutput,  # re-exported: imported from here
)
from pdserve.core.sched.step_plan import StepBudget, StepPlan


class Scheduler:
    forks_samples = True  # n > 1: later samples fork from the first (Request.forks)

    def __init__(self, config: EngineConfig, sliding_window: int | None = None) -> None:
        self.config = config
        self.kv_manager = KVCacheManager(config, sliding_window)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.num_preemptions = 0
        self.num_swaps_out = 0
        # Caps each step's prompt tokens so that streams decoding in it keep their ITL (None:
        # only max_num_batched_tokens; set by a worker started with --itl-slo).
        self.step_budget: StepBudget | None = None
        self.tenant_counters = TenantCounters()  # kept and read under the `fair` policy only

    # -- queue management -------------------------------------------------------------------

    def add(self, request: Request) -> None:
        if self.config.policy is SchedulingPolicy.FAIR:
            self.tenant_counters.join(request.params.tenant, self._tenants_with_work())
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def num_seats(self) -> int:
        """Sequences of the running batch, counting the forks its requests will make."""
        return sum(1 + len(request.forks) for request in self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def _tenants_with_work(self) -> set[str]:
        queues = (self.waiting, self.running, self.swapped)
        return {request.params.tenant for queue in queues for request in queue}

    def has_queued(self) -> bool:
        """Whether requests wait to (re)join the batch: preempted, swapped, or their KV here."""
        return bool(self.waiting or self.swapped)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Removes a request from whichever queue holds it and frees everything it owns; forks
        it has not made yet finish with it."""
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
            for leader in queue:
                if request in leader.forks:
                    leader.forks.remove(request)
        for fork in request.forks:
            fork.status = status
        request.forks = []
        self.kv_manager.free(request)
        request.status = status
        if not self.has_unfinished():
            self.kv_manager.release_swapped_in()  # no next step may come to do it; the copies ran

    def detach(self, request: Request) -> None:
        """Takes a request out of every queue, keeping its blocks (a live migration sends its KV
        before they are freed); a request with forks pending has none to detach."""
        assert not request.forks, "a request with forks pending is not detached"
        for queue in (self.waiting, self.running, self.swapped):
            if request in queue:
                queue.remove(request)
        if not self.has_unfinished():
            self.kv_manager.release_swapped_in()  # no next step may come to do it; the copies ran

    # -- one step -------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self.kv_manager.release_swapped_in()
        joining = self._decodes_joining()
        decodes = [*self._decodes(), *joining]
        limit = None if self.step_budget is None else self.step_budget.for_step(decodes)
        ids = frozenset(request.request_id for request in joining)
        step = StepPlan(self.config.max_num_batched_tokens, limit, ids)
        self._schedule_running(step)
        self._admit_queued(step)
        self.running.sort(key=self._rank)
        self._schedule_drafts(step)
        return step.output()

    def _decodes(self) -> list[Request]:
        """The one-token decodes the running batch will take this step (before admissions)."""
        return [r for r in self.running if r.target_tokens - r.num_computed_tokens == 1]

    def _decodes_joining(self) -> list[Request]:
        """Queued requests one token behind with their KV here (it arrived from the prefill
        tier, or they were swapped out), best first, as many as the batch has seats for: they
        decode this step, so prompt chunks leave them a token each and the step's ITL limit
        counts them. Decodes first, as Sarathi-Serve's stall-free batching orders a step: else
        a prompt chunking alone filled every step's budget, and a stream whose KV had landed
        waited for the whole prompt (a chat TTFT of 5 s behind a 1,900-token local prefill
        predicted at 0.3 s, docs/disaggregation.md)."""
        seats = self.config.max_num_seqs - self.num_seats()
        queued = sorted(self.swapped + self.waiting, key=self._rank)
        ready = [
            request
            for request in queued
            if request.num_computed_tokens > 0  # its KV is here (recompute starts at 0)
            and request.target_tokens - request.num_computed_tokens == 1
        ]
        return ready[: max(seats, 0)]

    def _schedule_running(self, step: StepPlan) -> None:
        for request in sorted(self.running, key=self._rank):
            if request.status is not RequestStatus.RUNNING or step.budget == 0:
                continue  # preempted earlier in this step
            num_new = step.tokens_for(request)
            if num_new == 0:
                continue  # a prompt chunk with no room left under the step budget
            while not self.kv_manager.grow(request, num_new, step.copies):
                victim = self._worst_running()
                self._preempt(victim, step)
                if victim is request:
                    break
            else:
                step.schedule(request, num_new)

    def _admit_queued(self, step: StepPlan) -> None:
        for request in sorted(self.swapped + self.waiting, key=self._rank):
            seats = self.num_seats() + 1 + len(request.forks)  # its forks will join the batch
            if step.budget == 0 or seats > self.config.max_num_seqs:
                return
            if step.best_preempted is not None and self._rank(request) >= step.best_preempted:
                return  # nothing worse than a request preempted this step may take its place
            # Fresh: nothing computed yet (not swapped, no KV that arrived from the prefill tier).
            fresh = request.status is RequestStatus.WAITING and not request.block_ids
            num_cached = self.kv_manager.take_cached_prefix(request) if fresh else 0
            num_new = step.tokens_for(request)
            if num_new == 0 or not self._make_room(request, num_new, step):
                if num_cached:  # gives its cached prefix back
                    self.kv_manager.free_for_recompute(request)
                if self.running:
                    return  # head-of-line: admitting later ones first would break the order
                continue  # nothing runs to free blocks for it: requests holding theirs may move
            if fresh:
                self.kv_manager.count_prefix_query(request)
            self._admit(request, num_new, step)

    def _admit(self, request: Request, num_new: int, step: StepPlan) -> None:
        """Moves a waiting or swapped request into the running batch for `num_new` tokens."""
        if request.status is RequestStatus.SWAPPED:
            step.swap_in.extend(self.kv_manager.swap_in(request))
            self.swapped.remove(request)
        else:
            self.waiting.remove(request)
        self.kv_manager.grow(request, num_new, step.copies)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        step.schedule(request, num_new)

    def _make_room(self, request: Request, num_new: int, step: StepPlan) -> bool:
        """Whether `request` fits; under `priority` it may preempt worse running requests."""
        while not self.kv_manager.can_grow(request, num_new):
            victim = self._worst_running() if self.running else None
            if (
                self.config.policy is not SchedulingPolicy.PRIORITY
                or victim is None
                or self._rank(victim) <= self._rank(request)
            ):
                return False
            self._preempt(victim, step)
        return True

    def _schedule_drafts(self, step: StepPlan) -> None:
        """Best first, each running request that catches up this step verifies its drafts too,
        as far as the budget and free blocks go (never preempting)."""
        for request in self.running:
            drafts, request.draft_token_ids = request.draft_token_ids, []
            num_new = step.scheduled.get(request.request_id)
            if not drafts or num_new is None or request.forks:
                continue
            if request.num_computed_tokens + num_new != request.num_tokens:
                continue  # a prefill chunk short of the end samples nothing to verify against
            drafts = drafts[: step.budget]
            if drafts and self.kv_manager.grow(request, num_new + len(drafts), step.copies):
                step.add_drafts(request, drafts)

    # -- after the forward -------------------------------------------------------------------

    def record_computed(self, request: Request, num_new: int) -> None:
        """The forward wrote `num_new` more tokens of KV: blocks it filled join the cache, and
        blocks the window passed go back to the pool (in that order, so they stay cached)."""
        num_computed_before = request.num_computed_tokens
        request.num_computed_tokens += num_new
        if self.config.policy is SchedulingPolicy.FAIR:
            self.tenant_counters.charge(request, num_new)
        self.kv_manager.cache_filled(request, num_computed_before)
        self.kv_manager.slide(request)
        if request.forks and request.num_computed_tokens == request.fork_point:
            self._fork(request)

    def record_verified(self, request: Request, num_verified: int) -> None:
        """A step verified drafts of `request`: of its scheduled tokens, the first `num_verified`
        hold KV the target confirmed (its last token and the drafts kept). The slots of the
        rejected drafts are rolled back."""
        self.record_computed(request, num_verified)
        self.kv_manager.roll_back(request)

    def _fork(self, leader: Request) -> None:
        """The leader's forks take a reference on each of its blocks and join the batch."""
        for fork in leader.forks:
            self.kv_manager.share(leader, fork)
            fork.num_computed_tokens = leader.num_computed_tokens
            fork.status = RequestStatus.RUNNING
            self.running.append(fork)
        leader.forks = []

    # -- preemption ----------------------------------------------------------------------------

    def _worst_running(self) -> Request:
        return max(self.running, key=self._rank)

    def _preempt(self, request: Request, step: StepPlan) -> None:
        rank = self._rank(request)
        step.best_preempted = (
            rank if step.best_preempted is None else min(step.best_preempted, rank)
        )
        self.running.remove(request)
        step.unschedule(request)
        step.preempted.append(request.request_id)
        request.num_preemptions += 1
        self.num_preemptions += 1
        sources = step.cancel_copies(request.block_ids)
        pairs = self.kv_manager.swap_out(request, sources)
        if pairs is None:  # swap pool full: recompute from scratch later
            self.kv_manager.free_for_recompute(request)
            request.status = RequestStatus.WAITING
            self.waiting.append(request)
            return
        step.swap_out.extend(pairs)
        request.status = RequestStatus.SWAPPED
        self.num_swaps_out += 1
        self.swapped.append(request)

    def _rank(self, request: Request) -> tuple[float, int, int]:
        """Sort key: smaller runs first. The worst request is the max.

        `fair` ranks by the tokens its tenant was served over its weight (fair_share.py), so the
        least-served tenant runs first and is preempted last.

        `sjf` ranks by remaining work (prompt tokens still to compute + output tokens still to
        generate) plus `sjf_aging_tokens` per arrival before it. A waiting request's work is fixed,
        so one with work W is overtaken by at most W / sjf_aging_tokens later arrivals: nothing
        starves, and the bound shrinks as the aging grows (at W / aging -> 0 it is fcfs).
        """
        order = (request.arrival_order, request.sample_index)
        if self.config.policy is SchedulingPolicy.PRIORITY:
            return (-request.params.priority, *order)
        if self.config.policy is SchedulingPolicy.SJF:
            age = self.config.sjf_aging_tokens * request.arrival_order
            return (request.remaining_work + age, *order)
        if self.config.policy is SchedulingPolicy.FAIR:
            return (self.tenant_counters.served(request.params.tenant), *order)
        return (0, *order)
