"""Worker lists from flags or DNS, re-resolution, Load polling and health."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pdserve.router.config import RouterConfig
from pdserve.router.registry import NoHealthyWorkerError, Registry
from pdserve.router.targets import (
    DnsTargets,
    StaticTargets,
    format_address,
    parse_targets,
    resolve_dns,
)
from pdserve.router.worker_health import FAILED_POLLS_TO_UNHEALTHY
from pdserve.testing.fake_tiers import fake_tiers

from .conftest import eventually


def test_parse_static_list_and_dns_name() -> None:
    assert parse_targets("--prefill", " a:1, b:2 ,a:1,[::1]:3") == StaticTargets(
        ("a:1", "b:2", "[::1]:3")
    )
    assert parse_targets("--decode", "dns:///decode.ns.svc.cluster.local:50071") == DnsTargets(
        "decode.ns.svc.cluster.local", 50071
    )


@pytest.mark.parametrize(
    "spec", ["", " , ", "host", "host:", "host:0", "host:x", ":80", "dns:///x"]
)
def test_bad_targets_name_the_flag(spec: str) -> None:
    with pytest.raises(ValueError, match=r"^--decode: "):
        parse_targets("--decode", spec)


def test_addresses_put_ipv6_in_brackets() -> None:
    assert format_address("10.0.0.7", 50061) == "10.0.0.7:50061"
    assert format_address("fd00::7", 50061) == "[fd00::7]:50061"
    assert format_address("decode-0.decode", 50071) == "decode-0.decode:50071"


def test_resolve_dns_gives_one_address_per_record() -> None:
    addresses = asyncio.run(resolve_dns("localhost", 50061))
    assert "127.0.0.1:50061" in addresses
    assert all(address.endswith(":50061") for address in addresses)


class FakeDns:
    """An injected resolver: `answer` is what the name resolves to right now."""

    def __init__(self) -> None:
        self.answer: list[str] = []
        self.fail = False
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append((host, port))
        if self.fail:
            raise OSError("temporary failure in name resolution")
        return list(self.answer)


def _dns_config(static_prefill: str, **overrides: Any) -> RouterConfig:
    fields: dict[str, Any] = {"load_poll_interval_seconds": 30.0, **overrides}
    return RouterConfig(
        prefill_targets=static_prefill, decode_targets="dns:///decode.test:50071", **fields
    )


async def _started_on_dns(
    tiers: Any, answer: list[str], **overrides: Any
) -> tuple[FakeDns, Registry]:
    """A registry whose decode tier is a DNS name (answering `answer`), started."""
    dns = FakeDns()
    dns.answer = answer
    registry = Registry(_dns_config(tiers.prefill_addresses[0], **overrides), resolver=dns)
    await registry.start()
    return dns, registry


def test_dns_workers_come_and_go_and_in_flight_calls_keep_theirs() -> None:
    async def body() -> None:
        async with fake_tiers(num_prefill=1, num_decode=3) as tiers:
            a, b, c = tiers.decode_addresses
            dns, registry = await _started_on_dns(tiers, [a, b])
            pool = registry.decode
            assert dns.asked[0] == ("decode.test", 50071)
            assert set(pool.workers) == {a, b} and pool.healthy_count() == 2
            assert registry.ready()

            dns.answer = [b, c]
            await registry.refresh()
            await registry.poll()
            assert set(pool.workers) == {b, c}  # a had nothing in flight: dropped at once

            busy = pool.workers[b]
            pool.acquire(busy)
            dns.answer = [c]
            await registry.refresh()
            assert pool.workers[b].removed  # kept while its call runs, but never picked
            assert {pool.pick().address for _ in range(5)} == {c}
            dns.answer = [b, c]  # back before its call ended: picked again
            await registry.refresh()
            assert not pool.workers[b].removed
            dns.answer = [c]
            await registry.refresh()
            pool.release(busy)
            assert set(pool.workers) == {c}

            dns.fail = True  # a failed lookup keeps the workers it had
            await registry.refresh()
            assert set(pool.workers) == {c}
            await registry.close()

    asyncio.run(body())


def test_dns_is_re_resolved_in_the_background() -> None:
    async def body() -> None:
        async with fake_tiers(num_prefill=1, num_decode=2) as tiers:
            a, b = tiers.decode_addresses
            dns, registry = await _started_on_dns(tiers, [a], resolve_interval_seconds=0.05)
            dns.answer = [a, b]
            await eventually(lambda: set(registry.decode.workers) == {a, b})
            await registry.close()

    asyncio.run(body())


def test_failed_load_marks_unhealthy_until_it_answers_again() -> None:
    async def body() -> None:
        async with fake_tiers(num_prefill=1, num_decode=2) as tiers:
            config = RouterConfig(
                prefill_targets=tiers.prefill_addresses[0],
                decode_targets=",".join(tiers.decode_addresses),
                load_poll_interval_seconds=30.0,
            )
            registry = Registry(config)
            await registry.start()
            healthy = {"tier": "decode", "state": "healthy"}
            assert REGISTRY.get_sample_value("pdserve_router_workers", healthy) == 2
            tiers.decode[0].knobs.load_fails = True
            await tiers.servers[2].stop(None)  # decode[1]'s server: a dead process
            await registry.poll()
            assert registry.decode.healthy_count() == 0 and not registry.ready()
            assert REGISTRY.get_sample_value("pdserve_router_workers", healthy) == 0
            with pytest.raises(NoHealthyWorkerError, match="no healthy decode worker"):
                registry.decode.pick()
            tiers.decode[0].knobs.load_fails = False
            tiers.decode[0].knobs.load.num_free_blocks = 77
            await registry.poll()
            worker = registry.decode.pick()
            assert worker.address == tiers.decode_addresses[0]
            assert worker.load().num_free_blocks == 77
            await registry.close()

    asyncio.run(body())


def test_pick_prefers_untried_workers_but_falls_back() -> None:
    async def body() -> None:
        async with fake_tiers(num_prefill=2, num_decode=1) as tiers:
            a, b = tiers.prefill_addresses
            config = RouterConfig(
                prefill_targets=f"{a},{b}",
                decode_targets=tiers.decode_addresses[0],
                load_poll_interval_seconds=30.0,
            )
            registry = Registry(config)
            await registry.start()
            pool = registry.prefill
            assert {pool.pick(avoid={a}).address for _ in range(4)} == {b}
            assert pool.has_untried({a}) and not pool.has_untried({a, b})
            # A lent worker of the other tier counts only where borrowed ones may be picked.
            lent = registry.decode.borrow(a)
            lent.healthy = True  # as once its first Load poll in the decode pool answered
            assert registry.decode.has_untried({tiers.decode_addresses[0]})
            assert not registry.decode.has_untried({tiers.decode_addresses[0]}, own=True)
            registry.decode.give_back(lent.address)
            pool.mark_unhealthy(pool.workers[b])
            assert pool.pick(avoid={a}).address == a
            await registry.close()

    asyncio.run(body())


def test_slow_load_answers_need_three_in_a_row_to_mark_unhealthy() -> None:
    async def body() -> None:
        async with fake_tiers() as tiers:
            config = RouterConfig(
                prefill_targets=tiers.prefill_addresses[0],
                decode_targets=tiers.decode_addresses[0],
                load_poll_interval_seconds=30.0,
                load_timeout_seconds=0.05,
            )
            registry = Registry(config)
            await registry.start()
            tiers.decode[0].knobs.load_delay_seconds = 0.2
            for _ in range(FAILED_POLLS_TO_UNHEALTHY - 1):
                await registry.poll()
            assert registry.decode.healthy_count() == 1  # a busy moment is not a dead worker
            await registry.poll()
            assert registry.decode.healthy_count() == 0
            # Slow, not dead: with no healthy worker left it still gets the work.
            assert registry.decode.pick().address == tiers.decode_addresses[0]
            tiers.decode[0].knobs.load_delay_seconds = 0.0
            await registry.poll()
            assert registry.decode.healthy_count() == 1
            tiers.decode[0].knobs.load_fails = True  # refused: dead, never picked
            await registry.poll()
            with pytest.raises(NoHealthyWorkerError):
                registry.decode.pick()
            await registry.close()

    asyncio.run(body())


def test_a_worker_leaving_during_its_load_poll_does_not_stop_the_polling() -> None:
    """Its channel closes under the Load in flight, and grpc raises CancelledError in the poll:
    that once ended the background poll loop for good, and no worker added after it was ever
    found healthy (a pod scaled up under load then got no traffic)."""

    async def body() -> None:
        async with fake_tiers(num_prefill=1, num_decode=2) as tiers:
            leaving, joining = tiers.decode_addresses
            dns, registry = await _started_on_dns(tiers, [leaving], load_poll_interval_seconds=0.05)
            tiers.decode[0].knobs.load_delay_seconds = 30.0  # its next Load stays in flight
            await asyncio.sleep(0.3)
            dns.answer = [joining]
            await registry.refresh()  # `leaving` is gone: its channel closes under the Load
            await eventually(lambda: registry.decode.healthy_count() == 1)
            assert registry.decode.pick().address == joining
            await registry.close()

    asyncio.run(body())
