"""A send that times out fails its own request only. Decode cancelled transfer A, so A's send
is never taken and times out; transfer B to the same decode worker is on the wire meanwhile (the
decode process is stopped while both are posted, so B cannot finish first). Releasing A's send
takes closing its endpoint: closed at once, as it used to be, B failed with it. The endpoint is
now retired, closed once B has settled, and the next transfer connects afresh."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from ucx_peers import LAYOUT, NUM_BLOCKS, TRANSPORTS, Peer

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

SEND_TIMEOUT_S = 4.0
# From the prefill call's start: A is posted at once; decode stops; B is posted; A times out at
# SEND_TIMEOUT_S; decode runs again, and B (posted B_AT_S) has until B_AT_S + SEND_TIMEOUT_S.
DECODE_STOPS_AT_S = 0.5
B_AT_S = 1.5
DECODE_RESUMES_AT_S = SEND_TIMEOUT_S + 0.5


def test_a_send_timeout_fails_its_own_transfer_not_the_others_to_that_peer() -> None:
    prefill = Peer("prefill", TRANSPORTS["tcp"], send_timeout_s=SEND_TIMEOUT_S)
    decode = Peer("decode", TRANSPORTS["tcp"])
    try:
        blocks = list(range(NUM_BLOCKS // 2))
        abandoned = decode.call("expect", "abandoned", blocks, LAYOUT)
        decode.call("cancel", "abandoned")  # nobody will take its send
        taken = decode.call("expect", "taken", blocks, LAYOUT)
        pid = decode.process.pid
        assert pid is not None
        stop = threading.Timer(DECODE_STOPS_AT_S, os.kill, (pid, signal.SIGSTOP))
        resume = threading.Timer(DECODE_RESUMES_AT_S, os.kill, (pid, signal.SIGCONT))
        stop.start()
        resume.start()
        try:
            outcomes = prefill.call(
                "send_staggered", [(abandoned, blocks, 0.0), (taken, blocks, B_AT_S)]
            )
        finally:
            resume.join()
        assert outcomes[0].startswith("SendAbandonedError"), outcomes
        assert outcomes[1] == "ok", outcomes
        assert decode.call("wait", "taken", 5.0) == "done"
        decode.call("cancel", "taken")
        again = decode.call("expect", "again", blocks, LAYOUT)  # on a fresh endpoint
        assert prefill.call("send_staggered", [(again, blocks, 0.0)]) == ["ok"]
        assert decode.call("wait", "again", 5.0) == "done"
        decode.call("cancel", "again")
    finally:
        prefill.stop()
        decode.stop()
