"""HTTP/2 keepalive on every pdserve channel and server: a peer that vanishes finds out.

A pod lost with its node, or cut off by a partition, sends no FIN and no RST: without pings
its TCP connections stay open until the kernel gives up retransmitting (about 15 minutes), so
the router's Multiplex stream to a vanished decode pod never fails, crash migration never
starts, and its clients wait; the other way round, decode keeps generating for a vanished
router until max_tokens. With keepalive each side pings the other after `time_seconds` without
a frame from it and closes the connection when no answer comes within `timeout_seconds`: every
stream on it then fails UNAVAILABLE, which the router migrates (router/dispatch.py) and decode
aborts (core/serving/multiplex.py). A lost peer is found within time + timeout seconds.

Servers accept pings at that pace: gRPC's default bears one ping per 5 minutes on an idle
connection and then closes it with GOAWAY ("too_many_pings").
"""

from __future__ import annotations

from dataclasses import dataclass

GrpcOptions = list[tuple[str, int]]


@dataclass(frozen=True)
class Keepalive:
    time_seconds: float = 10.0  # a ping after this long without a frame from the peer
    timeout_seconds: float = 5.0  # no answer this long after a ping: the peer is gone

    def __post_init__(self) -> None:
        if not self.time_seconds >= 0.1:
            raise ValueError(f"--keepalive-seconds: must be >= 0.1, got {self.time_seconds}")
        if not self.timeout_seconds >= 0.1:
            raise ValueError(
                f"--keepalive-timeout-seconds: must be >= 0.1, got {self.timeout_seconds}"
            )

    def channel_options(self) -> GrpcOptions:
        """For a channel: ping the server, also while no call is open."""
        return [
            *self._pings(),
            ("grpc.http2.max_pings_without_data", 0),  # no cap on pings between data frames
        ]

    def server_options(self) -> GrpcOptions:
        """For a server: ping each client too, and bear the clients' own pings."""
        return [
            *self._pings(),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", _ms(min(self.time_seconds, 1))),
            ("grpc.http2.max_ping_strikes", 0),  # never GOAWAY a client for pinging
        ]

    def _pings(self) -> GrpcOptions:
        return [
            ("grpc.keepalive_time_ms", _ms(self.time_seconds)),
            ("grpc.keepalive_timeout_ms", _ms(self.timeout_seconds)),
            ("grpc.keepalive_permit_without_calls", 1),
        ]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
