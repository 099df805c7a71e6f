"""Fixtures: a real prefill process and a real decode process talking UCX, per transport."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # spawned children import the peers by this name
import ucx_peers


@pytest.fixture(scope="module", params=sorted(ucx_peers.TRANSPORTS))
def peers(request: pytest.FixtureRequest) -> Iterator[tuple[ucx_peers.Peer, ucx_peers.Peer]]:
    """(prefill, decode) over the transport named by the param."""
    tls = ucx_peers.TRANSPORTS[request.param]
    started: list[ucx_peers.Peer] = []
    try:
        started.append(ucx_peers.Peer("decode", tls))
        started.append(ucx_peers.Peer("prefill", tls))
        yield started[1], started[0]
    finally:
        for peer in started:
            peer.stop()
