"""Real UCX between a real prefill process and a real decode process (shared memory and TCP)."""

from __future__ import annotations

import dataclasses
import secrets

import pytest
import torch
import ucx_peers
from ucx_peers import LAYOUT, Peer, PeerError

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

SRC_BLOCKS = [3, 7, 1]
DST_BLOCKS = [10, 2, 5]
NUM_TOKENS = 40  # 3 blocks of 16, the last one part-filled: whole blocks still travel
WAIT_S = 10.0


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32)  # compare bit patterns, not float values


def _untouched(before: torch.Tensor, after: torch.Tensor, touched: list[int]) -> bool:
    others = [b for b in range(ucx_peers.NUM_BLOCKS) if b not in touched]
    return torch.equal(_bits(before[:, :, others]), _bits(after[:, :, others]))


def test_blocks_land_exactly_and_nothing_else_changes(peers: tuple[Peer, Peer]) -> None:
    prefill, decode = peers
    source = prefill.call("cache")
    before = decode.call("cache")
    received_before, _ = decode.call("counters")
    sent_before, _ = prefill.call("counters")

    descriptor = decode.call("expect", "exact", DST_BLOCKS, LAYOUT)
    result = prefill.call("send", descriptor, SRC_BLOCKS, NUM_TOKENS)
    assert decode.call("wait", "exact", WAIT_S) == "done"

    after = decode.call("cache")
    assert torch.equal(_bits(after[:, :, DST_BLOCKS]), _bits(source[:, :, SRC_BLOCKS]))
    assert _untouched(before, after, DST_BLOCKS)
    whole_blocks = len(DST_BLOCKS) * LAYOUT.block_nbytes
    assert result.nbytes == whole_blocks == descriptor.nbytes
    assert decode.call("counters")[0] - received_before == whole_blocks
    assert prefill.call("counters")[0] - sent_before == whole_blocks
    decode.call("cancel", "exact")
    assert decode.call("tracked") == 0


def test_layout_mismatch_is_refused_on_both_sides(peers: tuple[Peer, Peer]) -> None:
    prefill, decode = peers
    other = dataclasses.replace(LAYOUT, dtype="bfloat16")
    with pytest.raises(PeerError) as on_decode:
        decode.call("expect", "mismatch", DST_BLOCKS, other)
    assert on_decode.value.kind == "LayoutMismatchError"
    assert str(LAYOUT) in on_decode.value.message and str(other) in on_decode.value.message

    descriptor = decode.call("expect", "mismatch", DST_BLOCKS, LAYOUT)
    foreign = dataclasses.replace(descriptor, layout=other)
    with pytest.raises(PeerError) as on_prefill:
        prefill.call("send", foreign, SRC_BLOCKS, NUM_TOKENS)
    assert on_prefill.value.kind == "LayoutMismatchError"
    assert str(LAYOUT) in on_prefill.value.message and str(other) in on_prefill.value.message
    assert decode.call("poll", "mismatch") == "pending"
    decode.call("cancel", "mismatch")
    assert decode.call("tracked") == 0


def test_cancel_frees_state_and_a_late_message_never_lands(peers: tuple[Peer, Peer]) -> None:
    prefill, decode = peers
    before = decode.call("cache")
    descriptor = decode.call("expect", "late", DST_BLOCKS, LAYOUT)
    decode.call("cancel", "late")
    assert decode.call("tracked") == 0
    with pytest.raises(PeerError) as polled:
        decode.call("poll", "late")
    assert polled.value.kind == "KeyError" and "late" in polled.value.message

    with pytest.raises(PeerError) as sent:
        prefill.call("send", descriptor, SRC_BLOCKS, NUM_TOKENS)
    assert sent.value.kind == "SendAbandonedError"  # a TransferTimeoutError, still posted
    assert _untouched(before, decode.call("cache"), [])


def test_a_wrong_token_never_lands_and_the_right_one_does(peers: tuple[Peer, Peer]) -> None:
    prefill, decode = peers
    before = decode.call("cache")
    descriptor = decode.call("expect", "token", DST_BLOCKS, LAYOUT)
    forged = dataclasses.replace(descriptor, token=secrets.token_bytes(16))
    with pytest.raises(PeerError) as sent:
        prefill.call("send", forged, SRC_BLOCKS, NUM_TOKENS)
    assert sent.value.kind == "SendAbandonedError"  # a TransferTimeoutError, still posted
    assert decode.call("poll", "token") == "pending"
    assert _untouched(before, decode.call("cache"), [])

    prefill.call("send", descriptor, SRC_BLOCKS, NUM_TOKENS)
    assert decode.call("wait", "token", WAIT_S) == "done"
    decode.call("cancel", "token")
    assert decode.call("tracked") == 0
