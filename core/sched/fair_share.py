"""Weighted fair sharing of a worker's steps between tenants: the `fair` scheduling policy.

A virtual token counter per tenant (Sheng et al., "Fairness in Serving Large Language Models",
OSDI 2024, VTC): every token the engine computes for a request, prompt or output, adds
1 / weight to its tenant's counter, and the scheduler ranks requests by their tenant's counter,
least first. So the least-served tenant's queued requests take free decode slots first, its
running prefills take the step's token budget first, and its running requests are preempted
last; while two tenants both have work, their counters (tokens / weight) stay close, so each
gets tokens in proportion to its weight, however many requests the other sends.

A tenant with no request in the worker keeps no credit: when it sends again it starts at the
least counter among the tenants that have work (its own is lifted to that, never lowered), so an
idle spell cannot be spent later as a burst that starves the others. When nobody has work the
counters start over from zero (only their differences under contention matter), which keeps them
bounded on a long-running worker.

The weight is the one the router's `--tenants` file gives the tenant
(`SamplingParams.tenant_weight`, stamped on every request the router sends); a worker called
directly serves everyone as the `default` tenant, weight 1, which is first-come first-served.
"""

from __future__ import annotations

from collections.abc import Iterable

from pdserve.core.request import Request


class TenantCounters:
    """Tokens served per tenant, each divided by its weight."""

    def __init__(self) -> None:
        self._served: dict[str, float] = {}

    def served(self, tenant: str) -> float:
        return self._served.get(tenant, 0.0)

    def join(self, tenant: str, tenants_with_work: Iterable[str]) -> None:
        """A request of `tenant` arrives while `tenants_with_work` have requests in the worker."""
        with_work = set(tenants_with_work)
        if not with_work:
            self._served.clear()
            return
        if tenant in with_work:
            return
        floor = min(self.served(other) for other in with_work)
        self._served[tenant] = max(self.served(tenant), floor)
        # A tenant without work at or below the floor would be lifted to it anyway: forgetting it
        # loses nothing and bounds the table however many tenant names come and go.
        for idle in [name for name, served in self._served.items() if served <= floor]:
            if idle not in with_work and idle != tenant:
                del self._served[idle]

    def charge(self, request: Request, num_tokens: int) -> None:
        """The engine computed `num_tokens` tokens of KV for `request`."""
        params = request.params
        self._served[params.tenant] = self.served(params.tenant) + num_tokens / params.tenant_weight
