"""The workers of each tier: one grpc.aio channel each, their health and their last load.

A worker enters from the flags or a DNS answer and answers `Load` every
--load-poll-interval-seconds; what an answer, or its absence, says of its health is
router/worker_health.py's: an unhealthy worker is not picked until it answers again (except that
one unhealthy only for answering late, busy not dead, is still picked when no healthy one is
left), and one given up as lost has its streams failed over (`on_lost`). A worker that leaves the
DNS answer, or whose Load says it drains, is no longer picked (`leaving`); its channel is closed
once its in-flight calls have ended, so a scale-down never cuts a running request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Generic

import grpc

from pdserve.core.serving.server import message_limits
from pdserve.core.serving.tls import secure_channel
from pdserve.router import metrics, step_gauges
from pdserve.router.config import RouterConfig, Tier
from pdserve.router.placement.prefix_hash import PrefixHash
from pdserve.router.placement.prefix_map import PrefixMap
from pdserve.router.placement.worker_choice import (
    RoutingPolicy,
    least_loaded,
    prefix_choice,
    rendezvous_choice,
)
from pdserve.router.targets import DnsTargets, Resolver, StaticTargets, parse_targets, resolve_dns
from pdserve.router.worker import StubT, Worker
from pdserve.router.worker_health import HealthLimits, poll_health
from pdserve.v1 import decode_pb2_grpc, prefill_pb2_grpc

if TYPE_CHECKING:
    from pdserve.v1.decode_pb2_grpc import DecodeAsyncStub
    from pdserve.v1.prefill_pb2_grpc import PrefillAsyncStub

log = logging.getLogger(__name__)


class NoHealthyWorkerError(RuntimeError):
    def __init__(self, tier: Tier) -> None:
        super().__init__(f"router: no healthy {tier.value} worker")
        self.tier = tier


class WorkerPool(Generic[StubT]):
    """The workers of one tier."""

    def __init__(
        self,
        tier: Tier,
        make_stub: Callable[[grpc.aio.Channel], StubT],
        config: RouterConfig,
        prefix_map: PrefixMap | None = None,
        prefix_hash: PrefixHash | None = None,
    ) -> None:
        self.tier = tier
        self.workers: dict[str, Worker[StubT]] = {}
        self._make_stub = make_stub
        self._health_limits = HealthLimits.of(config)
        self._costs = config.costs  # its per-worker corrections are exported as gauges
        # Called once when a worker is given up, its engine wedged or its Load silent (the
        # dispatcher fails its streams over); None: nothing to fail.
        self.on_lost: Callable[[Worker[StubT]], None] | None = None
        self._tls = config.worker_tls
        # A fixed HTTP/2 window (no BDP probing, which grows it to megabytes on a fast link):
        # a decode worker's Multiplex stream then cannot run more than 64 KB ahead of what this
        # router has read, so steps made while the router is behind wait at decode, where they
        # merge into one message, instead of queueing one by one in the transport.
        self._channel_options = [
            *message_limits(config.max_message_bytes),
            ("grpc.http2.bdp_probe", 0),
            *config.keepalive.channel_options(),  # a vanished worker fails its streams
            # gRPC backs off reconnecting from 1 s up to 120 s: a worker restarted at a fixed
            # address (or one not up yet when the router starts) would wait that long to be
            # polled again. A refused connect costs nothing: try again within half a second.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500),
        ]
        self._turn = 0
        self.prefix_map = prefix_map  # set under --routing-policy prefix (shared by both tiers)
        self.prefix_hash = prefix_hash  # set under --routing-policy prefix-hash (likewise)
        self._closing: set[asyncio.Task[None]] = set()
        self._targets: set[str] = set()  # from the flags or DNS
        # Another tier's workers lent to this one (placement/roles.py).
        self.borrowed: set[str] = set()

    def set_addresses(self, addresses: Iterable[str]) -> None:
        self._targets = set(addresses)
        self._apply_addresses()

    def borrow(self, address: str) -> Worker[StubT]:
        """A worker of the other tier joins this one until `give_back` (its role changed)."""
        self.borrowed.add(address)
        self._apply_addresses()
        return self.workers[address]

    def give_back(self, address: str) -> None:
        """Its calls in flight run to their end (a removed worker's channel closes after)."""
        self.borrowed.discard(address)
        self._apply_addresses()

    def _apply_addresses(self) -> None:
        wanted = self._targets | self.borrowed
        for address in wanted - self.workers.keys():
            channel = secure_channel(address, self._tls, self._channel_options)
            self.workers[address] = Worker(address, channel, self._make_stub(channel))
            if self.prefix_map is not None:
                self.prefix_map.forget(address)  # a new process behind a known address
            log.info("%s worker added: %s", self.tier.value, address)
        for address in wanted & self.workers.keys():
            worker = self.workers[address]
            if worker.removed:  # back in DNS before its last call ended
                worker.removed = False
                worker.answered_at = None  # not polled while out: silent from its next answer
                if not (worker.report and worker.report.draining):
                    worker.leaving.clear()
                log.info("%s worker back: %s", self.tier.value, address)
        for address in self.workers.keys() - wanted:
            worker = self.workers[address]
            if not worker.removed:
                worker.removed = True
                worker.leaving.set()
                log.info("%s worker removed: %s", self.tier.value, address)
            self._close_if_idle(worker)
        self._update_gauges()

    def pick(
        self, avoid: Collection[str] = (), prompt: Sequence[int] = (), own: bool = False
    ) -> Worker[StubT]:
        """A healthy worker for `prompt`, preferring those not in `avoid` (already tried): the
        least loaded, or under `--routing-policy prefix` the `prefix_choice`. `own`: only the
        tier's own workers, not borrowed ones (a lent prefill worker cannot receive KV). Under
        `prefix-hash`, the worker the prompt's leading blocks hash to, within a load bound."""
        live = [
            w
            for w in self.workers.values()
            if w.staying and not (own and w.address in self.borrowed)
        ]
        # Only slow ones left: a busy worker serves late, which beats refusing the request.
        usable = [w for w in live if w.healthy] or [w for w in live if w.slow]
        fresh = [w for w in usable if w.address not in avoid]
        candidates = sorted(fresh or usable, key=lambda worker: worker.address)
        if not candidates:
            raise NoHealthyWorkerError(self.tier)
        self._turn += 1
        loads = [w.load() for w in candidates]
        if self.prefix_hash is not None:
            key = self.prefix_hash.key(prompt)
            addresses = [w.address for w in candidates]
            return candidates[rendezvous_choice(loads, addresses, key, self._turn)]
        if self.prefix_map is None:
            return candidates[least_loaded(loads, self._turn)]
        hashes = self.prefix_map.hashes(prompt)
        matched = [self.prefix_map.matched(w.address, hashes) for w in candidates]
        chosen = candidates[prefix_choice(loads, matched, len(hashes), self._turn)]
        self.prefix_map.record(chosen.address, hashes)
        return chosen

    def acquire(self, worker: Worker[StubT]) -> None:
        """A request sent to `worker`: counts towards its load until the next poll."""
        self.hold(worker)
        worker.dispatched_since_poll += 1

    def hold(self, worker: Worker[StubT]) -> None:
        """Keeps `worker`'s channel open (even once it has left DNS) until `release`."""
        worker.in_flight += 1

    def release(self, worker: Worker[StubT]) -> None:
        worker.in_flight -= 1
        self._close_if_idle(worker)

    def mark_unhealthy(self, worker: Worker[StubT]) -> None:
        """After a connection failure: skip it until its next successful Load."""
        worker.healthy, worker.slow = False, False
        self._update_gauges()

    def in_flight(self) -> int:
        """Calls this router has in flight on the tier's healthy workers."""
        return sum(w.in_flight for w in self.workers.values() if w.serving)

    def healthy_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.serving)

    def has_untried(self, tried: Collection[str], own: bool = False) -> bool:
        """Whether a healthy worker not in `tried` is left (`own`: of the tier's own, as
        `pick(own=True)` would choose from)."""
        return any(
            w.serving and w.address not in tried
            for w in self.workers.values()
            if not (own and w.address in self.borrowed)
        )

    async def poll(self) -> None:
        workers = [w for w in self.workers.values() if not w.removed]
        await asyncio.gather(*(self._poll_one(worker) for worker in workers))
        self._update_gauges()

    async def _poll_one(self, worker: Worker[StubT]) -> None:
        poll = worker.sent_prompts.poll_started()
        outcome = await poll_health(worker, self.tier, self._health_limits)
        if outcome.lost and self.on_lost is not None:
            self.on_lost(worker)
        report = outcome.report
        if report is None:
            return
        worker.report, worker.dispatched_since_poll = report, 0
        worker.sent_prompts.reported(poll)
        if self.prefix_map is not None:
            self.prefix_map.set_capacity(worker.address, report.num_cacheable_blocks)
        step_gauges.export(self._costs, self.tier.value, worker.address, report)

    def _close_if_idle(self, worker: Worker[StubT]) -> None:
        if worker.removed and worker.in_flight == 0 and self.workers.get(worker.address) is worker:
            del self.workers[worker.address]
            if self.prefix_map is not None:
                self.prefix_map.forget(worker.address)
            step_gauges.forget(self.tier.value, worker.address)
            task = asyncio.get_running_loop().create_task(worker.channel.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _update_gauges(self) -> None:
        known = sum(1 for w in self.workers.values() if not w.removed)
        metrics.WORKERS.labels(self.tier.value, "known").set(known)
        metrics.WORKERS.labels(self.tier.value, "healthy").set(self.healthy_count())

    async def close(self) -> None:
        for worker in list(self.workers.values()):
            # Its gauges live on the process's registry: a closed pool reports no worker.
            step_gauges.forget(self.tier.value, worker.address)
            await worker.channel.close()
        self.workers.clear()
        await asyncio.gather(*self._closing, return_exceptions=True)


def _prefill_stub(channel: grpc.aio.Channel) -> PrefillAsyncStub:
    return prefill_pb2_grpc.PrefillStub(channel)


def _decode_stub(channel: grpc.aio.Channel) -> DecodeAsyncStub:
    return decode_pb2_grpc.DecodeStub(channel)


class Registry:
    """Both tiers' pools, kept current by a DNS re-resolve loop and a Load poll loop."""

    def __init__(self, config: RouterConfig, resolver: Resolver = resolve_dns) -> None:
        self.config = config
        # One map for both tiers (keys are worker addresses): a request's prompt is hashed once.
        prefix = config.routing_policy is RoutingPolicy.PREFIX
        prefixes = PrefixMap(config.block_size) if prefix else None
        hashed = config.routing_policy is RoutingPolicy.PREFIX_HASH
        keys = PrefixHash(config.block_size, config.prefix_hash_blocks) if hashed else None
        self.prefill = WorkerPool(Tier.PREFILL, _prefill_stub, config, prefixes, keys)
        self.decode = WorkerPool(Tier.DECODE, _decode_stub, config, prefixes, keys)
        self._targets = {
            Tier.PREFILL: parse_targets("--prefill", config.prefill_targets, allow_empty=True),
            Tier.DECODE: parse_targets("--decode", config.decode_targets),
        }
        self._resolver = resolver
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Resolves and polls once, then keeps doing both in the background."""
        await self.refresh()
        await self.poll()
        self._tasks = [
            asyncio.create_task(_every(self.config.load_poll_interval_seconds, self.poll)),
        ]
        if any(isinstance(targets, DnsTargets) for targets in self._targets.values()):
            interval = self.config.resolve_interval_seconds
            self._tasks.append(asyncio.create_task(_every(interval, self.refresh)))

    async def refresh(self) -> None:
        await self._refresh_pool(self.prefill, self._targets[Tier.PREFILL])
        await self._refresh_pool(self.decode, self._targets[Tier.DECODE])

    async def _refresh_pool(
        self, pool: WorkerPool[StubT], targets: StaticTargets | DnsTargets
    ) -> None:
        if isinstance(targets, StaticTargets):
            pool.set_addresses(targets.addresses)
            return
        try:
            addresses = await self._resolver(targets.host, targets.port)
        except OSError as error:
            # A DNS hiccup must not drop every worker; dead ones fail their Load poll anyway.
            log.warning(
                "resolving %s failed, keeping %d workers: %s",
                targets.host,
                len(pool.workers),
                error,
            )
            return
        pool.set_addresses(addresses)

    async def poll(self) -> None:
        await asyncio.gather(self.prefill.poll(), self.decode.poll())

    def ready(self) -> bool:
        """At least one healthy worker in each tier (none needed in a prefill tier configured
        empty: every prompt is then prefilled on decode)."""
        no_prefill_tier = self._targets[Tier.PREFILL] == StaticTargets(addresses=())
        prefill_ok = no_prefill_tier or self.prefill.healthy_count() > 0
        return prefill_ok and self.decode.healthy_count() > 0

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.prefill.close()
        await self.decode.close()


async def _every(interval: float, action: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await action()
        except Exception:  # one bad round must not end the loop for good
            log.exception("registry: background %s failed", getattr(action, "__name__", action))
