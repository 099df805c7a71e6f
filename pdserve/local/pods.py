"""`pdserve up --netns`: every process in a pod of its own, workers found through DNS, scaled as
a Deployment is.

The router and each worker run in their own network namespace (`netns.PodNetwork`); the router
finds each tier by a name (`dns:///decode.pdserve.internal:PORT`) that the DNS server of this
process (`dns_registry`) answers with one A record per ready worker. All workers of a tier
serve on the same port (a record carries no port), each on its pod's address. KV crosses UCX
over TCP on each pod's `eth0`: UCX_TLS=tcp keeps UCX off shared memory, which separate network
namespaces alone would not.

A worker (a `Member`) moves through `MemberState`:

    STARTING (spawned in a new pod) --SERVING--> READY (its A record published)
    READY --scale down--> LEAVING (record removed: the router may still pick it until it
          re-resolves) --one resolve interval--> DRAINING (SIGTERM: it finishes or moves its
          work, --drain-grace-seconds) --exited--> gone (pod deleted)
    READY --died (crash, SIGKILL)--> gone at once, and replaced

`reconcile()` is one pass of that state machine that never blocks: `pdserve up` runs it twice a
second. `scale()` sets the desired counts (as `kubectl scale` sets a Deployment's replicas) and
waits until the passes have reached them. Scaling down takes the members still starting first,
then the newest ready ones.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdserve.local.cluster import (
    ClusterSpec,
    Launch,
    Process,
    is_ready,
    spawn,
    stop_processes,
    wait_router_sees,
)
from pdserve.local.cpu_limit import CpuGroup, CpuGroups
from pdserve.local.dns_registry import DnsRegistry, tier_name
from pdserve.local.netns import (
    NO_SHAPING,
    LinkShaping,
    NetnsError,
    Pod,
    PodNetwork,
    choose_subnet,
    host_routes,
    remove_stale,
)
from pdserve.local.status import ClusterStatus, Departure, MemberView, ScaleError

log = logging.getLogger(__name__)

TIERS = ("prefill", "decode")
PORT_OFFSETS = {"router": 0, "prefill": 10, "decode": 20}  # as `Cluster`'s first workers
RESOLVE_INTERVAL_S = 1.0  # the router's --resolve-interval-seconds under --netns
# Pod links are TCP between separate network stacks: UCX's shared-memory transports are off, and
# peer failure is detected (a dead pod fails a transfer instead of hanging it).
POD_UCX_ENV = (("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "eth0"), ("UCX_WARN_UNUSED_ENV_VARS", "n"))
POD_WORKER_ARGS = ("--ucx-endpoint-error-handling", "true")
EXIT_MARGIN_S = 15.0  # past the drain grace, as the chart's terminationGracePeriodSeconds


class MemberState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    LEAVING = "leaving"
    DRAINING = "draining"


@dataclass
class Member:
    """One worker and its pod; `since` is when it entered its state (monotonic seconds)."""

    process: Process
    pod: Pod
    state: MemberState
    since: float
    cpu_group: CpuGroup | None = None  # under --pod-cpus

    @property
    def tier(self) -> str:
        return self.process.role


class PodCluster:
    """Router + workers in pods; `start()` first, `stop()` always (also after a failed start)."""

    def __init__(
        self,
        spec: ClusterSpec,
        shaping: LinkShaping = NO_SHAPING,
        log_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        pod_cpus: float | None = None,
    ) -> None:
        if spec.num_routers != 1:
            raise ValueError("pods run one router (ClusterSpec.num_routers must be 1)")
        self.spec = spec
        self.log_dir = log_dir
        self.pod_cpus = pod_cpus  # every worker pod's CPU quota in cores; None: no limit
        self._cpu_groups: CpuGroups | None = None
        self._clock = clock
        self.prefix = f"pds{spec.base_port}"
        self.shaping = shaping
        self.network: PodNetwork | None = None
        self.dns: DnsRegistry | None = None
        self.router_process: Process | None = None
        self._router_pod: Pod | None = None
        self._members: list[Member] = []
        self._departures: list[Departure] = []
        self._next_index = dict.fromkeys(TIERS, 0)
        self.desired = {"prefill": spec.num_prefill, "decode": spec.num_decode}
        self._lock = threading.Condition()

    # --- the Cluster interface the tests and `pdserve up` read ---

    @property
    def router(self) -> Process:
        if self.router_process is None:
            raise RuntimeError("the router is not started")
        return self.router_process

    @property
    def prefill(self) -> list[Process]:
        return self._ready("prefill")

    @property
    def decode(self) -> list[Process]:
        return self._ready("decode")

    @property
    def processes(self) -> list[Process]:
        with self._lock:
            workers = [m.process for m in self._members]
        return [*workers, *([self.router_process] if self.router_process else [])]

    @property
    def http_url(self) -> str:
        return f"http://{self.router.host}:{self.spec.router_http_port}"

    def cpu_groups(self) -> list[CpuGroup]:
        """The CPU groups of the workers now in the cluster (none without --pod-cpus)."""
        with self._lock:
            return [m.cpu_group for m in self._members if m.cpu_group is not None]

    def _ready(self, tier: str) -> list[Process]:
        with self._lock:
            return [
                m.process for m in self._members if m.tier == tier and m.state is MemberState.READY
            ]

    # --- start and stop ---

    def start(self, timeout_s: float = 300.0) -> None:
        """Network, DNS, the first workers (published once ready), then the router."""
        stale = remove_stale(self.prefix)
        if self.pod_cpus is not None:
            self._cpu_groups = CpuGroups()
            stale += self._cpu_groups.remove_stale(self.prefix)
            log.info(
                "worker pods limited to %g CPUs each (%s)",
                self.pod_cpus,
                self._cpu_groups.version.value,
            )
        if stale:
            log.warning("removed what an earlier run on this port left: %s", ", ".join(stale))
        subnet = choose_subnet(self.spec.base_port, host_routes())
        self.network = PodNetwork(self.prefix, subnet, self.shaping)
        self.network.open()
        names = [tier_name(tier) for tier in TIERS]
        try:
            self.dns = DnsRegistry(self.network.gateway, names=names)
        except OSError as error:  # something else serves port 53 on every address
            raise NetnsError(f"cannot serve DNS on {self.network.gateway}:53: {error}") from error
        self.dns.start()
        deadline = self._clock() + timeout_s
        while not self.settled():
            self.reconcile()
            if self._clock() > deadline:
                raise TimeoutError(f"workers not ready in {timeout_s:.0f}s")
            time.sleep(0.2)
        self._start_router(deadline)

    def _start_router(self, deadline: float) -> None:
        network = self._network()
        self._router_pod = network.add_pod("router")
        port = self.spec.base_port
        targets = {
            tier: f"dns:///{tier_name(tier)}:{port + PORT_OFFSETS[tier]}"
            if self.desired[tier] > 0
            else ""
            for tier in TIERS
        }
        extra = (
            *("--prefill", targets["prefill"], "--decode", targets["decode"]),
            *("--resolve-interval-seconds", str(RESOLVE_INTERVAL_S)),
            *("--http-port", str(self.spec.router_http_port)),
            *self.spec.router_args,
        )
        self.router_process = self._spawn_in(self._router_pod, "router", 0, extra)
        while not is_ready(self.router_process, self.spec.tls):
            if self.router_process.popen.poll() is not None:
                raise self.router_process.exited()
            if self._clock() > deadline:
                raise TimeoutError("router not ready in time")
            time.sleep(0.2)
        wait_router_sees(self.router_process, self.desired, deadline - self._clock())

    def stop(self) -> None:
        """SIGTERM everyone (they drain), SIGKILL who is left, then the pods, DNS and bridge."""
        with self._lock:
            processes = self.processes
            groups = [m.cpu_group for m in self._members if m.cpu_group is not None]
            self._members.clear()
        stop_processes(processes, self.spec.drain_grace_seconds + EXIT_MARGIN_S)
        for group in groups:
            self._groups().remove(group)
        if self.dns is not None:
            self.dns.close()
            self.dns = None
        if self.network is not None:
            self.network.close()  # every pod, then the bridge
            self.network = None

    def __enter__(self) -> PodCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- scaling ---

    def scale(self, desired: dict[str, int], timeout_s: float = 600.0) -> ClusterStatus:
        """Sets the desired counts of the tiers named in `desired`; returns once every tier has
        that many ready workers and none is leaving or draining, with who left meanwhile."""
        self._check(desired)
        with self._lock:
            departed = len(self._departures)
            self.desired.update(desired)
            self._lock.notify_all()
            if not self._lock.wait_for(self.settled, timeout=timeout_s):
                raise TimeoutError(f"not scaled to {self.desired} in {timeout_s:.0f}s")
            return self._status(self._departures[departed:])

    def _check(self, desired: dict[str, int]) -> None:
        for tier, count in desired.items():
            if tier not in TIERS:
                raise ScaleError(f"unknown tier {tier!r}")
            if tier == "prefill" and (count == 0) != (self.spec.num_prefill == 0):
                raise ScaleError(
                    "--prefill: a cluster started with prefill workers keeps at least one, and "
                    "one started with --prefill 0 (decode prefills) gets none"
                )
            if tier == "decode" and count < 1:
                raise ScaleError(f"--decode: must be >= 1, got {count}")

    def status(self) -> ClusterStatus:
        with self._lock:
            return self._status([])

    def _status(self, departures: list[Departure]) -> ClusterStatus:
        members = tuple(
            MemberView(m.process.name, m.tier, m.process.address, m.state.value)
            for m in self._members
        )
        return ClusterStatus(dict(self.desired), members, tuple(departures))

    def settled(self) -> bool:
        """Every tier has exactly its desired count of ready workers, and nothing is moving."""
        with self._lock:
            if any(m.state is not MemberState.READY for m in self._members):
                return False
            return all(
                sum(1 for m in self._members if m.tier == tier) == self.desired[tier]
                for tier in TIERS
            )

    # --- the reconcile pass ---

    def reconcile(self) -> Process | None:
        """One pass; returns the router if it died (then `pdserve up` stops)."""
        with self._lock:
            for member in list(self._members):
                self._advance(member)
            for tier in TIERS:
                self._match_count(tier)
            self._lock.notify_all()
        router = self.router_process
        return router if router is not None and router.popen.poll() is not None else None

    def _advance(self, member: Member) -> None:
        exit_code = member.process.popen.poll()
        now = self._clock()
        if member.state is MemberState.DRAINING:
            if exit_code is None and now - member.since > self._exit_deadline():
                member.process.popen.kill()  # past its grace: as the kubelet would
                exit_code = member.process.popen.wait()
                self._depart(member, exit_code, now - member.since, killed=True)
            elif exit_code is not None:
                self._depart(member, exit_code, now - member.since)
        elif exit_code is not None:
            if member.state is MemberState.STARTING:
                raise RuntimeError(f"{member.process.name} exited while starting ({exit_code})")
            log.warning("%s exited unexpectedly (%d)", member.process.name, exit_code)
            self._unpublish(member)
            self._depart(member, exit_code, None)
        elif member.state is MemberState.STARTING and is_ready(member.process, self.spec.tls):
            self._publish(member)
            self._enter(member, MemberState.READY)
        elif member.state is MemberState.LEAVING and now - member.since > RESOLVE_INTERVAL_S * 2:
            member.process.popen.terminate()  # SIGTERM: the worker drains
            self._enter(member, MemberState.DRAINING)

    def _match_count(self, tier: str) -> None:
        staying = [
            m
            for m in self._members
            if m.tier == tier and m.state in (MemberState.STARTING, MemberState.READY)
        ]
        for _ in range(self.desired[tier] - len(staying)):
            self._members.append(self._start_worker(tier))
        # The not-yet-ready first, then the newest: the oldest keep their warm caches.
        surplus = sorted(staying, key=lambda m: (m.state is MemberState.READY, -m.process.index))
        for member in surplus[: max(len(staying) - self.desired[tier], 0)]:
            self._leave(member)

    def _leave(self, member: Member) -> None:
        if member.state is MemberState.STARTING:  # never published: no drain needed
            member.process.popen.terminate()
            self._enter(member, MemberState.DRAINING)
            return
        self._unpublish(member)
        self._enter(member, MemberState.LEAVING)

    def _start_worker(self, tier: str) -> Member:
        index = self._next_index[tier]
        self._next_index[tier] += 1
        pod = self._network().add_pod(f"{tier}-{index}")
        tier_args = self.spec.prefill_args if tier == "prefill" else self.spec.decode_args
        extra = (*POD_WORKER_ARGS, *self.spec.worker_args, *tier_args)
        group = None
        try:
            if self.pod_cpus is not None:
                group = self._groups().create(pod.namespace, self.pod_cpus)
            process = self._spawn_in(pod, tier, index, extra, group)
        except BaseException:
            self._network().remove_pod(pod)
            if group is not None:
                self._groups().remove(group)
            raise
        log.info("%s starting in pod %s (%s)", process.name, pod.namespace, pod.address)
        return Member(process, pod, MemberState.STARTING, self._clock(), group)

    def _spawn_in(
        self,
        pod: Pod,
        role: str,
        index: int,
        extra: tuple[str, ...],
        cpu_group: CpuGroup | None = None,
    ) -> Process:
        offset = PORT_OFFSETS[role]
        launch = Launch(
            role=role,
            index=index,
            host=pod.address,
            port=self.spec.base_port + offset,
            metrics_port=self.spec.metrics_base_port + offset,
            extra=extra,
            prefix=tuple(pod.exec_prefix()),
            env=POD_UCX_ENV,
            cpu_group=cpu_group,
        )
        return spawn(self.spec, launch, self.log_dir)

    def _publish(self, member: Member) -> None:
        self._dns().table.add(tier_name(member.tier), member.pod.address)
        log.info("%s ready: %s published", member.process.name, member.pod.address)

    def _unpublish(self, member: Member) -> None:
        self._dns().table.remove(tier_name(member.tier), member.pod.address)

    def _depart(
        self, member: Member, exit_code: int, drain_seconds: float | None, killed: bool = False
    ) -> None:
        self._members.remove(member)
        self._network().remove_pod(member.pod)
        if member.cpu_group is not None:
            self._groups().remove(member.cpu_group)
        departure = Departure(
            member.process.name, member.process.address, exit_code, drain_seconds, killed
        )
        self._departures.append(departure)
        log.info("%s gone: %s", member.process.name, departure)

    def _enter(self, member: Member, state: MemberState) -> None:
        member.state, member.since = state, self._clock()

    def _exit_deadline(self) -> float:
        return self.spec.drain_grace_seconds + EXIT_MARGIN_S

    def _network(self) -> PodNetwork:
        if self.network is None:
            raise RuntimeError("the pod network is not open")
        return self.network

    def _groups(self) -> CpuGroups:
        if self._cpu_groups is None:
            raise RuntimeError("no CPU groups: the cluster runs without --pod-cpus")
        return self._cpu_groups

    def _dns(self) -> DnsRegistry:
        if self.dns is None:
            raise RuntimeError("the DNS server is not started")
        return self.dns
