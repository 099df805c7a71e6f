"""A prefill process that dies mid-transfer: decode's receive fails (it is not left pending), and
the failure is retrieved, not leaked as asyncio's 'Future exception was never retrieved'."""

from __future__ import annotations

import pytest
from ucx_peers import TRANSPORTS, Peer, PeerError

from pdserve.core.kv.cache import KVLayout

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

# The real model's block shape: 64 blocks are 46 MB, a transfer of tens of milliseconds, so the
# sender can die while decode is still pulling the bytes (CMA over shared memory).
BIG = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype="float32")
NUM_BLOCKS = 64
# When the sender dies after posting: too early and decode never heard of the send (pending),
# too late and the bytes all arrived (done). Tried in turn until one lands mid-transfer.
DEATH_DELAYS_S = (0.002, 0.005, 0.001, 0.01, 0.0005, 0.02)


def test_sender_death_fails_the_receive_and_its_error_is_retrieved(
    capfd: pytest.CaptureFixture[str],
) -> None:
    decode = Peer("decode", TRANSPORTS["sm"], BIG, NUM_BLOCKS)
    states = []
    try:
        for attempt, delay in enumerate(DEATH_DELAYS_S):
            states.append(_die_mid_transfer(decode, f"dies-{attempt}", delay))
            if states[-1] == "failed":
                break
        decode.call("gc")  # a failed future nobody retrieved is reported when collected
        assert decode.call("tracked") == 0
    finally:
        decode.stop()
    assert "failed" in states, f"no death landed mid-transfer: {states}"
    assert "never retrieved" not in capfd.readouterr().err


def _die_mid_transfer(decode: Peer, request_id: str, delay_s: float) -> str:
    prefill = Peer("prefill", TRANSPORTS["sm"], BIG, NUM_BLOCKS)
    try:
        blocks = list(range(NUM_BLOCKS))
        descriptor = decode.call("expect", request_id, blocks, BIG)
        with pytest.raises((EOFError, OSError, PeerError, TimeoutError)):
            prefill.call("send_and_die", descriptor, blocks, delay_s, timeout_s=10)
        state: str = decode.call("wait", request_id, 5.0, timeout_s=20)
        decode.call("cancel", request_id)
        return state
    finally:
        prefill.process.join(timeout=5)
