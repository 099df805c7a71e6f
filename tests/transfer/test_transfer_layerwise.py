"""Layer-wise push over real UCX: a transfer in 3 pieces (layers [0], [1], [2, 3]) between a real
prefill process and a real decode process, over shared memory and TCP."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest
import torch
import ucx_peers
from ucx_peers import LAYOUT, Peer

from pdserve.core.transfer.staging import staging_nbytes

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

NUM_PIECES = 3
SRC_BLOCKS = [3, 7, 1]
DST_BLOCKS = [10, 2, 5]
NUM_TOKENS = 40
WAIT_S = 10.0


@pytest.fixture(scope="module", params=sorted(ucx_peers.TRANSPORTS))
def peers(request: pytest.FixtureRequest) -> Iterator[tuple[Peer, Peer]]:
    """(prefill, decode), decode expecting every transfer in NUM_PIECES pieces."""
    tls = ucx_peers.TRANSPORTS[request.param]
    started: list[Peer] = []
    try:
        started.append(Peer("decode", tls, num_pieces=NUM_PIECES))
        started.append(Peer("prefill", tls))
        yield started[1], started[0]
    finally:
        for peer in started:
            peer.stop()


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_bits(a), _bits(b))


def _others(blocks: list[int]) -> list[int]:
    return [b for b in range(ucx_peers.NUM_BLOCKS) if b not in blocks]


def test_pieces_land_exactly_in_any_order_and_nothing_else_changes(
    peers: tuple[Peer, Peer],
) -> None:
    prefill, decode = peers
    source, before = prefill.call("cache"), decode.call("cache")
    received_before, _ = decode.call("counters")
    descriptor = decode.call("expect", "pieces", DST_BLOCKS, LAYOUT)
    assert descriptor.num_pieces == NUM_PIECES

    assert prefill.call("push", descriptor, SRC_BLOCKS, [2]).startswith("TransferError")
    assert decode.call("wait", "pieces", 0.2) == "pending"  # pieces 0 and 1 not there yet
    assert prefill.call("push", descriptor, SRC_BLOCKS, [0, 1]).startswith("TransferError")
    assert decode.call("wait", "pieces", WAIT_S) == "done"

    after = decode.call("cache")
    assert _same(after[:, :, DST_BLOCKS], source[:, :, SRC_BLOCKS])
    assert _same(after[:, :, _others(DST_BLOCKS)], before[:, :, _others(DST_BLOCKS)])
    assert decode.call("counters")[0] - received_before == descriptor.nbytes
    decode.call("cancel", "pieces")
    assert decode.call("tracked") == 0


def test_whole_send_in_pieces_reports_whole_blocks(peers: tuple[Peer, Peer]) -> None:
    prefill, decode = peers
    descriptor = decode.call("expect", "whole", DST_BLOCKS, LAYOUT)
    result = prefill.call("send", descriptor, SRC_BLOCKS, NUM_TOKENS)
    assert decode.call("wait", "whole", WAIT_S) == "done"
    assert result.nbytes == len(DST_BLOCKS) * LAYOUT.block_nbytes
    decode.call("cancel", "whole")


def test_a_short_piece_never_lands_and_cancel_frees_the_rest(peers: tuple[Peer, Peer]) -> None:
    prefill, decode = peers
    before = decode.call("cache")
    descriptor = decode.call("expect", "short", DST_BLOCKS, LAYOUT)
    rejected = decode.call("rejected")
    prefill.call("send_short", descriptor, 1)  # right tag, no token trailer
    assert decode.call("wait", "short", WAIT_S) == "failed"
    assert decode.call("rejected") == rejected + 1  # counted (a metric on decode)
    assert _same(decode.call("cache"), before)
    idle = decode.call("idle_staging")
    decode.call("cancel", "short")  # pieces 0 and 2 are still posted: cancel completes them
    assert decode.call("tracked") == 0
    assert _staging_back(decode, idle + staging_nbytes(LAYOUT, 3, NUM_PIECES))


def test_a_wrong_token_piece_never_lands_and_the_right_one_does(
    peers: tuple[Peer, Peer],
) -> None:
    prefill, decode = peers
    source, before = prefill.call("cache"), decode.call("cache")
    descriptor = decode.call("expect", "forged", DST_BLOCKS, LAYOUT)
    forged = dataclasses.replace(descriptor, token=bytes(16))
    prefill.call("push", descriptor, SRC_BLOCKS, [0, 2])
    assert "SendAbandonedError" in prefill.call("push", forged, SRC_BLOCKS, [1])
    assert decode.call("poll", "forged") == "pending"
    assert _same(decode.call("cache")[1], before[1])  # layer 1 = piece 1: untouched

    prefill.call("push", descriptor, SRC_BLOCKS, [1])
    assert decode.call("wait", "forged", WAIT_S) == "done"
    assert _same(decode.call("cache")[:, :, DST_BLOCKS], source[:, :, SRC_BLOCKS])
    decode.call("cancel", "forged")
    assert decode.call("tracked") == 0


def test_cancel_mid_transfer_frees_both_sides(peers: tuple[Peer, Peer]) -> None:
    prefill, decode = peers
    before = decode.call("cache")
    sender_idle = prefill.call("idle_staging")
    descriptor = decode.call("expect", "mid", DST_BLOCKS, LAYOUT)
    outcome = prefill.call("push", descriptor, SRC_BLOCKS, [0])  # landed; 1 and 2 never come
    assert "never pushed" in outcome
    assert decode.call("wait", "mid", 0.2) == "pending"
    idle = decode.call("idle_staging")
    decode.call("cancel", "mid")
    assert decode.call("tracked") == 0
    assert _staging_back(decode, idle + staging_nbytes(LAYOUT, 3, NUM_PIECES))
    assert prefill.call("idle_staging") >= sender_idle  # the sender's staging is back too
    layers = list(range(1, LAYOUT.num_layers))  # piece 0 (layer 0) landed; the rest did not
    after = decode.call("cache")
    assert _same(after[layers], before[layers])
    assert _same(after[0][:, DST_BLOCKS], prefill.call("cache")[0][:, SRC_BLOCKS])


def _staging_back(decode: Peer, idle_bytes: int) -> bool:
    """Whether decode's idle staging reaches `idle_bytes` within WAIT_S: a cancel returns it once
    UCX has completed the cancelled receives (it does not wait for that itself)."""
    deadline = time.monotonic() + WAIT_S
    while decode.call("idle_staging") < idle_bytes:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
