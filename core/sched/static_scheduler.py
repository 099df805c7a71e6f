"""The static-batching baseline the seeds compare against, over the same runner.

FCFS batches of `max_num_seqs`: a batch is admitted whole (prompts in one step, no chunking) and
no request joins until every request of the batch has finished, so slots of early finishers sit
idle. That idleness is exactly what continuous batching removes. It shares no blocks between the
n samples of a prompt either: each computes the prompt itself.
"""

from __future__ import annotations

from pdserve.core.sched.scheduler import Scheduler
from pdserve.core.sched.step_plan import StepPlan


class StaticScheduler(Scheduler):
    forks_samples = False  # it prefills whole prompts at once: n samples run as n requests

    def _admit_queued(self, step: StepPlan) -> None:
        if self.running:
            return
        step.budget = 1 << 62  # a static batch prefills its whole prompts together
        queued = sorted(self.swapped + self.waiting, key=lambda r: r.arrival_order)
        for request in queued[: self.config.max_num_seqs]:
            num_new = request.num_tokens - request.num_computed_tokens
            if not self.kv_manager.can_grow(request, num_new):
                return
            self._admit(request, num_new, step)
