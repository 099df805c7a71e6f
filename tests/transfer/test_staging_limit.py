"""A decode worker's staging for KV on its way in is bounded (`--kv-staging-limit-mb`): three
transfers expected at once under a limit that holds one of them post one transfer's receives;
the others wait unposted (their sender's messages wait in UCX meanwhile), and each posts once
the one before it has landed (decode's engine lands transfers as it polls them, as the test
does here). Every transfer still lands exactly, and no staging stays held."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from ucx_peers import LAYOUT, TRANSPORTS, Peer

from pdserve.core.transfer.staging import staging_nbytes

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

BLOCKS_EACH = 4
TRANSFERS = 3  # within ucx_peers.NUM_BLOCKS (12): each into its own blocks
WAIT_S = 10.0
SEND_TIMEOUT_S = 20.0  # the waiting transfers' senders wait this long at most


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_transfers_past_the_staging_limit_wait_their_turn_and_all_land(transport: str) -> None:
    one = staging_nbytes(LAYOUT, BLOCKS_EACH, 1)
    decode = Peer("decode", TRANSPORTS[transport], staging_limit_bytes=one + one // 2)
    prefill = Peer("prefill", TRANSPORTS[transport], send_timeout_s=SEND_TIMEOUT_S)
    try:
        source = prefill.call("cache")
        destinations = [
            list(range(i * BLOCKS_EACH, (i + 1) * BLOCKS_EACH)) for i in range(TRANSFERS)
        ]
        sources = [list(reversed(blocks)) for blocks in destinations]
        descriptors = [
            decode.call("expect", f"t{i}", blocks, LAYOUT) for i, blocks in enumerate(destinations)
        ]
        assert decode.call("waiting_for_staging") == TRANSFERS - 1  # one posted; two wait

        sent: list[Any] = []
        transfers = list(zip(descriptors, sources, strict=True))
        sending = threading.Thread(
            target=lambda: sent.append(prefill.call("send_all", transfers, timeout_s=60))
        )
        sending.start()
        states = [decode.call("wait", f"t{index}", WAIT_S) for index in range(TRANSFERS)]
        sending.join()
        assert states == ["done"] * TRANSFERS
        (_, outcomes) = sent[0]
        assert [outcome for outcome, _ in outcomes] == ["ok"] * TRANSFERS
        landed = decode.call("cache")
        for src, dst in zip(sources, destinations, strict=True):
            assert torch.equal(landed[:, :, dst], source[:, :, src])
        assert decode.call("waiting_for_staging") == 0
        for index in range(TRANSFERS):
            decode.call("cancel", f"t{index}")
        assert decode.call("tracked") == 0
    finally:
        prefill.stop()
        decode.stop()
