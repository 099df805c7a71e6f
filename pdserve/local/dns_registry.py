"""The DNS server of `pdserve up --netns`: one A record per ready worker, as a headless Service.

The router finds each tier by a name (`dns:///decode.pdserve.internal:PORT`) that it re-resolves
every --resolve-interval-seconds through the ordinary system resolver (its pod's resolv.conf
names this server). `pdserve up` adds a worker's record once the worker is ready and removes it
before the worker is told to drain, so the router stops picking it first. Records carry a TTL of
0: nothing between the router and this server may cache an answer past a scale step.

dnslib encodes and decodes the DNS messages and runs the UDP server thread; this module only
answers questions from its table.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterable
from typing import Any

from dnslib import QTYPE, RCODE, RR, A, DNSLabel, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

# `.internal` is set aside for private names (ICANN, 2024); `.local` would go to multicast DNS on
# hosts whose nsswitch.conf has mdns4_minimal, and never reach this server.
ZONE = "pdserve.internal"
DNS_PORT = 53  # resolv.conf cannot name another port
TTL_SECONDS = 0


def tier_name(tier: str) -> str:
    """The name the router resolves for a tier, e.g. `decode.pdserve.internal`."""
    return f"{tier}.{ZONE}"


class RecordTable:
    """Name -> IPv4 addresses, changed by `pdserve up` and read by the server thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[DNSLabel, set[str]] = {}

    def add(self, name: str, address: str) -> None:
        ipaddress.IPv4Address(address)  # a ValueError names a bad address before it is served
        with self._lock:
            self._records.setdefault(DNSLabel(name), set()).add(address)

    def remove(self, name: str, address: str) -> None:
        with self._lock:
            self._records.get(DNSLabel(name), set()).discard(address)

    def declare(self, name: str) -> None:
        """A name that exists even with no record (NOERROR, no answer; never NXDOMAIN)."""
        with self._lock:
            self._records.setdefault(DNSLabel(name), set())

    def lookup(self, name: DNSLabel) -> tuple[str, ...] | None:
        """The addresses of `name`, sorted; None when the name does not exist."""
        with self._lock:
            addresses = self._records.get(name)
            return None if addresses is None else tuple(sorted(addresses))


class _TableResolver(BaseResolver):  # type: ignore[misc]  # dnslib ships no type hints
    def __init__(self, table: RecordTable) -> None:
        self._table = table

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        question = request.q
        addresses = self._table.lookup(question.qname)
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        # AAAA and other types of a known name: an empty NOERROR answer, so that a resolver
        # asking for A and AAAA at once keeps the A records.
        if question.qtype in (QTYPE.A, QTYPE.ANY):
            for address in addresses:
                reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(address), ttl=TTL_SECONDS))
        return reply


class DnsRegistry:
    """A `RecordTable` served over UDP on `address:port` from a daemon thread."""

    def __init__(self, address: str, port: int = DNS_PORT, names: Iterable[str] = ()) -> None:
        self.table = RecordTable()
        for name in names:
            self.table.declare(name)
        quiet = DNSLogger("-request,-reply,-truncated,-error,-recv,-send,-data")
        self._server = DNSServer(
            _TableResolver(self.table), address=address, port=port, logger=quiet
        )
        self.address = address
        self.port = int(self._server.server.server_address[1])  # the bound one (port 0 in tests)

    def start(self) -> None:
        self._server.start_thread()

    def close(self) -> None:
        self._server.stop()
        self._server.server.server_close()

    def __enter__(self) -> DnsRegistry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
