"""What `pdserve up --netns` reports about its workers: to `pdserve scale`, over its control
endpoint (as JSON), and to tests."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Departure:
    """A worker that left: how, and how long its drain took (SIGTERM to exit)."""

    name: str
    address: str
    exit_code: int
    drain_seconds: float | None  # None: it died, nobody drained it
    killed: bool = False  # still running past the grace period, so SIGKILLed


@dataclass(frozen=True)
class MemberView:
    """A worker still there: e.g. `decode-2` at `198.18.3.4:50071`, `ready`."""

    name: str
    tier: str  # prefill | decode
    address: str  # host:port in its pod
    state: str  # a pod_cluster.MemberState value


@dataclass(frozen=True)
class ClusterStatus:
    """The counts wanted per tier, the workers there now, and (after a scale request) the ones
    that left while it ran."""

    desired: dict[str, int]
    members: tuple[MemberView, ...]
    departures: tuple[Departure, ...] = field(default=())

    def ready(self, tier: str) -> int:
        return sum(1 for m in self.members if m.tier == tier and m.state == "ready")


class ScaleError(ValueError):
    """A scale request this cluster cannot follow; the message names the flag."""
