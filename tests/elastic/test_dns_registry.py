"""The DNS server of `pdserve up --netns`, asked over UDP by dnslib's client (no processes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dnslib import QTYPE, RCODE, DNSRecord

from pdserve.local.dns_registry import DnsRegistry, tier_name


@pytest.fixture
def registry() -> Iterator[DnsRegistry]:
    with DnsRegistry("127.0.0.1", port=0, names=[tier_name("decode")]) as running:
        yield running


def _ask(registry: DnsRegistry, name: str, qtype: str = "A") -> DNSRecord:
    question = DNSRecord.question(name, qtype)
    return DNSRecord.parse(question.send(registry.address, registry.port, timeout=5))


def _addresses(reply: DNSRecord) -> list[str]:
    return sorted(str(answer.rdata) for answer in reply.rr if answer.rtype == QTYPE.A)


def test_one_a_record_per_worker_follows_adds_and_removes(registry: DnsRegistry) -> None:
    name = tier_name("decode")
    registry.table.add(name, "198.18.0.3")
    registry.table.add(name, "198.18.0.2")
    reply = _ask(registry, name)
    assert _addresses(reply) == ["198.18.0.2", "198.18.0.3"]
    assert all(answer.ttl == 0 for answer in reply.rr)  # nobody may cache past a scale step
    registry.table.remove(name, "198.18.0.3")
    assert _addresses(_ask(registry, name)) == ["198.18.0.2"]
    assert _addresses(_ask(registry, name.upper())) == ["198.18.0.2"]  # names are caseless


def test_a_known_name_answers_aaaa_and_emptiness_without_nxdomain(registry: DnsRegistry) -> None:
    name = tier_name("decode")
    empty = _ask(registry, name)
    assert empty.header.rcode == RCODE.NOERROR and not empty.rr
    registry.table.add(name, "198.18.0.2")
    aaaa = _ask(registry, name, "AAAA")
    assert aaaa.header.rcode == RCODE.NOERROR and not aaaa.rr


def test_an_unknown_name_is_nxdomain(registry: DnsRegistry) -> None:
    assert _ask(registry, "other.pdserve.internal").header.rcode == RCODE.NXDOMAIN


def test_a_bad_address_is_refused_before_it_is_served(registry: DnsRegistry) -> None:
    with pytest.raises(ValueError):
        registry.table.add(tier_name("decode"), "not-an-address")
