"""The router's `--max-queue` places and who holds them: when they run short, who is refused and
who is displaced.

Every admitted request holds one place per stream it runs (its samples) until its call ends. While
places are free any request takes them (work-conserving: a tenant may use more than its share
while nobody else wants it). When they run short, a newcomer may displace holders that have not
streamed a token yet (their work has not started, or only in a queue): first those of lower
priority, then, at equal priority, those of a tenant holding more than its weighted share while
the newcomer's tenant stays within its own. Displaced requests are told so at once
(RESOURCE_EXHAUSTED, reason `displaced`, a retry delay) and cancelled on the workers; never
dropped silently. If displacing cannot free enough places the newcomer is refused instead
(reason `fair_share` when its tenant would hold more than its share while other tenants hold
places, else `queue_full`).

A tenant's share is `--max-queue x its weight / the weights of the tenants holding places` (the
newcomer's included): the weighted fair share of a resource among those who want it.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field


class Refused(enum.Enum):
    """Why a request got no places (the `reason` label of the rejections counter)."""

    QUEUE_FULL = "queue_full"
    FAIR_SHARE = "fair_share"
    DISPLACED = "displaced"  # held places, lost them to a request ranked above it


@dataclass(eq=False)
class Holder:
    """One admitted request's places (identity matters, not value: two may look alike)."""

    tenant: str
    priority: int
    streams: int
    arrival: int = 0
    started: bool = False  # a token has been streamed: no longer displaceable
    displaced_by: str | None = None  # set when displaced: why, for its caller
    on_displaced: Callable[[], object] = field(default=lambda: None, repr=False)


class Places:
    def __init__(self, capacity: int, weight: Callable[[str], float]) -> None:
        self.capacity = capacity
        self._weight = weight
        self._holders: list[Holder] = []
        self._arrivals = itertools.count()

    @property
    def in_flight(self) -> int:
        return sum(holder.streams for holder in self._holders)

    def held_by(self, tenant: str) -> int:
        return sum(h.streams for h in self._holders if h.tenant == tenant)

    def take(self, newcomer: Holder) -> Refused | None:
        """Gives `newcomer` its places, displacing holders if it must (each displaced one's
        `on_displaced` is called); why not (nothing changed) when it cannot."""
        victims = self._victims(newcomer)
        if isinstance(victims, Refused):
            return victims
        for victim in victims:
            self.release(victim)
            victim.displaced_by = (
                "a request of higher priority"
                if victim.priority < newcomer.priority
                else f"tenant {newcomer.tenant!r} within its fair share"
            )
            victim.on_displaced()
        newcomer.arrival = next(self._arrivals)
        self._holders.append(newcomer)
        return None

    def release(self, holder: Holder) -> None:
        if holder in self._holders:
            self._holders.remove(holder)

    def _victims(self, newcomer: Holder) -> list[Holder] | Refused:
        short = self.in_flight + newcomer.streams - self.capacity
        if short <= 0:
            return []
        within_share = self.held_by(newcomer.tenant) + newcomer.streams <= self.share(
            newcomer.tenant
        )
        joining = newcomer.tenant
        candidates = sorted(
            (h for h in self._holders if self._may_displace(newcomer, h, within_share)),
            key=lambda h: (h.priority, -self._excess(h.tenant, joining), -h.arrival),
        )
        chosen: list[Holder] = []
        removed: dict[str, int] = {}  # streams chosen so far, per tenant
        for candidate in candidates:
            if short <= 0:
                break
            left = self.held_by(candidate.tenant) - removed.get(candidate.tenant, 0)
            if candidate.priority == newcomer.priority and left <= self.share(
                candidate.tenant, joining
            ):
                continue  # displacing for fairness stops at the tenant's share
            chosen.append(candidate)
            removed[candidate.tenant] = removed.get(candidate.tenant, 0) + candidate.streams
            short -= candidate.streams
        if short > 0:  # over its share while others hold places, it yields to them
            others = any(h.tenant != newcomer.tenant for h in self._holders)
            return Refused.FAIR_SHARE if others and not within_share else Refused.QUEUE_FULL
        return chosen

    def _may_displace(self, newcomer: Holder, holder: Holder, within_share: bool) -> bool:
        if holder.started or holder.priority > newcomer.priority:
            return False
        if holder.priority < newcomer.priority:
            return True
        over_share = self._excess(holder.tenant, newcomer.tenant) > 0
        return within_share and holder.tenant != newcomer.tenant and over_share

    def share(self, tenant: str, joining: str | None = None) -> float:
        """The tenant's weighted share of the places among the tenants holding any, it, and
        the newcomer's tenant (`joining`)."""
        tenants = {h.tenant for h in self._holders} | {tenant} | ({joining} if joining else set())
        total = sum(self._weight(name) for name in tenants)
        return self.capacity * self._weight(tenant) / total

    def _excess(self, tenant: str, joining: str) -> float:
        return self.held_by(tenant) - self.share(tenant, joining)
