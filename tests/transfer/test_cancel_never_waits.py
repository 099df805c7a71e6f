"""A cancel on decode never waits on the network: a prefill peer that stalls mid-transfer (its
process stopped, as a frozen node's would be) leaves a receive matched and unfinished, and
`cancel` still returns at once. It runs on decode's engine thread: before, it waited up to
CANCEL_TIMEOUT_S (5 s) for that receive, and every stream on the worker waited with it. The
staging buffer comes back once the receive ends, or is let go after CANCEL_TIMEOUT_S."""

from __future__ import annotations

import time

import pytest
from ucx_peers import TRANSPORTS, Peer

from pdserve.core.kv.cache import KVLayout
from pdserve.core.transfer.ucx import CANCEL_TIMEOUT_S

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

# The real model's block shape: 64 blocks are 46 MB, tens of milliseconds over loopback TCP, so
# the sender can stop while decode's receive is under way.
BIG = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype="float32")
NUM_BLOCKS = 64
# When the sender stops after posting: too early and no receive is matched yet (the message to
# ourselves completes it at once), too late and every byte arrived. Tried until one is under way
# (here 0.02 s was, and the shorter ones were too early; a slower host may need the longer ones).
STALL_AFTER_S = (0.02, 0.04, 0.01, 0.08, 0.005, 0.16, 0.3)
CANCEL_RETURNS_WITHIN_S = 0.5  # UCX's own calls, not the network: milliseconds on any host
LET_GO_MARGIN_S = 5.0  # a busy host's scheduling


def test_cancel_returns_at_once_while_a_stalled_sender_holds_the_receive() -> None:
    decode = Peer("decode", TRANSPORTS["tcp"], BIG, NUM_BLOCKS)
    try:
        took: list[tuple[float, int]] = []  # per attempt: cancel's seconds, receives held
        for attempt, after_s in enumerate(STALL_AFTER_S):
            took.append(_cancel_during_a_stall(decode, f"stalled-{attempt}", after_s))
            if took[-1][1]:
                break
        assert all(seconds < CANCEL_RETURNS_WITHIN_S for seconds, _ in took), took
        assert took[-1][1] == 1, f"no stall landed mid-transfer: {took}"
        assert decode.call("tracked") == 0
        _until_let_go(decode)
    finally:
        decode.stop()


def _cancel_during_a_stall(decode: Peer, request_id: str, after_s: float) -> tuple[float, int]:
    """(seconds the cancel took, cancelled receives UCX still held right after it)."""
    prefill = Peer("prefill", TRANSPORTS["tcp"], BIG, NUM_BLOCKS)
    try:
        blocks = list(range(NUM_BLOCKS))
        descriptor = decode.call("expect", request_id, blocks, BIG)
        prefill.call("send_then_stall", descriptor, blocks, after_s)
        time.sleep(after_s + 0.2)  # the sender is stopped now
        seconds: float = decode.call("timed_cancel", request_id)
        return seconds, decode.call("cancelling")
    finally:
        prefill.process.kill()  # the stalled receive fails: UCX lets go of its buffer
        prefill.process.join(timeout=10)


def _until_let_go(decode: Peer) -> None:
    """The stalled receive ends (the killed sender's connection fails it: its staging returns
    to the pool) or CANCEL_TIMEOUT_S passes (its staging is let go): either way nothing stays
    counted as held."""
    deadline = time.monotonic() + CANCEL_TIMEOUT_S + LET_GO_MARGIN_S
    while decode.call("cancelling"):
        assert time.monotonic() < deadline, "a cancelled transfer's staging is still held"
        time.sleep(0.05)
