"""A free TCP port on 127.0.0.1 for a benchmark's own servers (the OS picks it)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now; the caller binds it soon after (a race it accepts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
