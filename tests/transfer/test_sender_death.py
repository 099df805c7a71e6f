"""A prefill process that dies mid-transfer: decode's receive fails (it is not left pending), and
the failure is retrieved, not leaked as asyncio's 'Future exception was never retrieved'."""

from __future__ import annotations

import pytest
from ucx_peers import TRANSPORTS, Peer, PeerError

from pdserve.core.kv_cache import KVLayout

# The real model's block shape: 64 blocks are 46 MB, a transfer of tens of milliseconds, so the
# sender dies while decode is still pulling the bytes (CMA over shared memory).
BIG = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype="float32")
NUM_BLOCKS = 64


def test_sender_death_fails_the_receive_and_its_error_is_retrieved(
    capfd: pytest.CaptureFixture[str],
) -> None:
    decode = Peer("decode", TRANSPORTS["sm"], BIG, NUM_BLOCKS)
    prefill = Peer("prefill", TRANSPORTS["sm"], BIG, NUM_BLOCKS)
    try:
        blocks = list(range(NUM_BLOCKS))
        descriptor = decode.call("expect", "dies", blocks, BIG)
        with pytest.raises((EOFError, OSError, PeerError, TimeoutError)):
            prefill.call("send_and_die", descriptor, blocks, 0.002, timeout_s=10)
        assert decode.call("wait", "dies", 10.0, timeout_s=20) == "failed"
        decode.call("cancel", "dies")
        decode.call("gc")  # a failed future nobody retrieved is reported when collected
        assert decode.call("tracked") == 0
    finally:
        decode.stop()
        prefill.process.join(timeout=5)
    assert "never retrieved" not in capfd.readouterr().err
