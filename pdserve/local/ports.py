"""Free TCP ports on 127.0.0.1, picked by the OS, for servers a benchmark, a planner run or a test
starts on this machine.

Why not fixed ports: any port in the host's ephemeral range (32768-60999 on Linux) can be held by
another process's outgoing connection or by another cluster's worker; the planner's runs, on a
fixed base there, had a worker exit at start on CI."""

from __future__ import annotations

import socket

LAST_PORT = 65000  # a range must end below this


def free_port() -> int:
    """A port nothing listens on now; the caller binds it soon after (a race it accepts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_port_bases(count: int, span: int = 30) -> list[int]:
    """`count` base ports whose spans [base, base + span) are disjoint and free right now.

    One probe for all of them: bases probed one at a time can overlap (nothing holds a probed
    port), and a worker then finds its port taken by another's metrics server."""
    for _ in range(100):
        first = free_port()
        total = count * span
        if first + total < LAST_PORT and all(_is_free(first + offset) for offset in range(total)):
            return [first + index * span for index in range(count)]
    raise RuntimeError("no free port range")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
