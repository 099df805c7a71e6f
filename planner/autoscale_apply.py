"""Where `pdserve autoscale`'s decisions go.

- `LocalPods`: a `pdserve up --netns` on this machine, through its control endpoint (what
  `pdserve scale` calls), waiting until the new pods are ready or the removed ones drained.
- `ReplicaGauges`: on Kubernetes, gauges the chart's HorizontalPodAutoscalers read as an
  External metric (`pdserve_autoscale_desired_replicas{tier}`, through an adapter such as
  prometheus-adapter; docs/autoscaling.md). The HPAs own the Deployments' replica counts and
  Kubernetes does the scaling: pods start, and pods leaving get SIGTERM, drain and move their
  streams with their KV (docs/elasticity.md). Nothing here talks to the API server, so the
  autoscaler's pod needs no RBAC.

Either way `current` is the shape decisions are taken against: the pods there now, locally; on
Kubernetes the shape last asked for (the router sees a new pod only once it is ready, and
deciding against that would take back a scale-up still starting).
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import Gauge

from pdserve.local.scale_control import request_scale
from pdserve.local.status import ClusterStatus, Departure
from pdserve.planner.autoscale import Decision, Shape, TierCorrection

SCALE_TIMEOUT_S = 600.0  # a pod's model load on a busy host, or a drain's grace


class Applier(Protocol):
    def current(self) -> Shape: ...

    def apply(self, shape: Shape) -> tuple[Shape, tuple[Departure, ...]]:
        """Scales to `shape`; the shape reached and the workers that left on the way."""
        ...

    def record(self, decision: Decision) -> None:
        """Every decision, applied or not."""
        ...


class LocalPods:
    def __init__(self, port: int) -> None:
        self.port = port

    def current(self) -> Shape:
        return ready_shape(request_scale(self.port, {}, timeout_s=10))

    def apply(self, shape: Shape) -> tuple[Shape, tuple[Departure, ...]]:
        wanted = {"prefill": shape.prefill, "decode": shape.decode}
        status = request_scale(self.port, wanted, timeout_s=SCALE_TIMEOUT_S)
        return ready_shape(status), status.departures

    def record(self, decision: Decision) -> None:
        pass


def ready_shape(status: ClusterStatus) -> Shape:
    return Shape(status.ready("prefill"), status.ready("decode"))


DESIRED = Gauge(
    "pdserve_autoscale_desired_replicas",
    "Pods each tier should run, as pdserve autoscale last decided (the chart's HPAs scale the "
    "tier's Deployment to it, as an External metric with an AverageValue target of 1)",
    ["tier"],
)
WANTED = Gauge(
    "pdserve_autoscale_wanted_replicas",
    "Pods the last interval's load alone wanted per tier (desired waits --down-after intervals "
    "before following it down)",
    ["tier"],
)
CORRECTION = Gauge(
    "pdserve_autoscale_step_correction",
    "Measured / predicted step time of each tier's pods, the factor the simulated pods were "
    "scaled by in the last decision (1: not measured yet)",
    ["tier"],
)


class ReplicaGauges:
    def __init__(self, start: Shape) -> None:
        self._asked = start
        _set(DESIRED, start)

    def current(self) -> Shape:
        return self._asked

    def apply(self, shape: Shape) -> tuple[Shape, tuple[Departure, ...]]:
        self._asked = shape
        _set(DESIRED, shape)
        return shape, ()

    def record(self, decision: Decision) -> None:
        _set(WANTED, decision.wanted)
        correction: TierCorrection = decision.correction
        CORRECTION.labels("prefill").set(correction.prefill)
        CORRECTION.labels("decode").set(correction.decode)


def _set(gauge: Gauge, shape: Shape) -> None:
    gauge.labels("prefill").set(shape.prefill)
    gauge.labels("decode").set(shape.decode)
