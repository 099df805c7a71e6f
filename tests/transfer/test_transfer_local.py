"""The in-process backend and the checks every backend shares (no UCX, no processes)."""

from __future__ import annotations

import dataclasses
import secrets

import pytest
import torch

from pdserve.core.kv.cache import KVCache, KVLayout
from pdserve.core.transfer.interface import (
    KVReceiverLike,
    KVSenderLike,
    LayoutMismatchError,
    TransferError,
    TransferState,
    layer_groups,
    piece_tag,
    send_whole,
)
from pdserve.kernels.kv_quant import dequantize, quantize
from tests.fakes.local_transfer import LocalKVReceiver, LocalKVSender, LocalTransferHub

LAYOUT = KVLayout(num_layers=2, num_kv_heads=3, head_dim=8, block_size=4, dtype="bfloat16")
SRC, DST = [3, 7, 1], [10, 2, 5]
Pair = tuple[LocalKVSender, LocalKVReceiver, KVCache, KVCache]


def _pair(layout: KVLayout, num_pieces: int) -> Pair:
    hub = LocalTransferHub()
    source, target = KVCache(layout, 12, "cpu"), KVCache(layout, 12, "cpu")
    source.tensor.copy_(
        torch.randn(source.tensor.shape, generator=torch.Generator().manual_seed(0))
    )
    return LocalKVSender(hub), LocalKVReceiver(hub, target, num_pieces), source, target


@pytest.fixture
def pair() -> Pair:
    return _pair(LAYOUT, num_pieces=1)


def test_blocks_land_exactly_and_counters_count_whole_blocks(pair: Pair) -> None:
    sender, receiver, source, target = pair
    descriptor = receiver.expect("r", DST, LAYOUT)
    assert receiver.poll("r") is TransferState.PENDING
    result = send_whole(sender, descriptor, source, SRC, num_tokens=9).result()
    assert receiver.poll("r") is TransferState.DONE
    assert torch.equal(target.tensor[:, :, DST], source.tensor[:, :, SRC])
    others = [b for b in range(12) if b not in DST]
    assert not target.tensor[:, :, others].any()
    assert result.nbytes == sender.bytes_sent == receiver.bytes_received == 3 * LAYOUT.block_nbytes
    receiver.cancel("r")
    assert receiver.num_tracked == 0


def test_layout_mismatch_names_both_layouts(pair: Pair) -> None:
    sender, receiver, source, _ = pair
    other = dataclasses.replace(LAYOUT, num_layers=3)
    with pytest.raises(LayoutMismatchError, match="num_layers=3") as refused:
        receiver.expect("r", DST, other)
    assert refused.value.expected == LAYOUT and refused.value.got == other
    descriptor = dataclasses.replace(receiver.expect("r", DST, LAYOUT), layout=other)
    with pytest.raises(LayoutMismatchError, match="num_layers=2"):
        send_whole(sender, descriptor, source, SRC, 9)


@pytest.mark.parametrize(
    ("src", "num_tokens", "field"),
    [
        ([3, 7], 8, "src_block_ids"),
        ([3, 3, 1], 9, "src_block_ids"),
        ([3, 7, 99], 9, "src_block_ids"),
        (SRC, 8, "num_tokens"),
        (SRC, 13, "num_tokens"),
    ],
)
def test_bad_send_arguments_name_the_field(
    pair: Pair, src: list[int], num_tokens: int, field: str
) -> None:
    sender, receiver, source, _ = pair
    descriptor = receiver.expect("r", DST, LAYOUT)
    with pytest.raises(ValueError, match=field):
        send_whole(sender, descriptor, source, src, num_tokens)
    assert receiver.poll("r") is TransferState.PENDING


@pytest.mark.parametrize("block_ids", [[], [1, 1], [-1], [12]])
def test_bad_reservations_name_the_field(pair: Pair, block_ids: list[int]) -> None:
    _, receiver, _, _ = pair
    with pytest.raises(ValueError, match="block_ids"):
        receiver.expect("r", block_ids, LAYOUT)


def test_request_expected_twice_is_refused(pair: Pair) -> None:
    _, receiver, _, _ = pair
    receiver.expect("r", DST, LAYOUT)
    with pytest.raises(ValueError, match="request_id"):
        receiver.expect("r", [0], LAYOUT)


def test_wrong_token_and_late_messages_never_land(pair: Pair) -> None:
    sender, receiver, source, target = pair
    descriptor = receiver.expect("r", DST, LAYOUT)
    forged = dataclasses.replace(descriptor, token=secrets.token_bytes(16))
    send_whole(sender, forged, source, SRC, 9)
    assert receiver.poll("r") is TransferState.PENDING
    receiver.cancel("r")
    send_whole(sender, descriptor, source, SRC, 9)
    assert not target.tensor.any()
    with pytest.raises(KeyError, match="'r'"):
        receiver.poll("r")


def test_unreachable_peer_fails_the_future(pair: Pair) -> None:
    _, _, source, _ = pair
    hub = LocalTransferHub()
    broken = LocalKVReceiver(hub, KVCache(LAYOUT, 12, "cpu"))
    hub.break_peer(broken.address())
    descriptor = broken.expect("r", DST, LAYOUT)
    with pytest.raises(TransferError, match="peer_address"):
        send_whole(LocalKVSender(hub), descriptor, source, SRC, 9).result()


def test_tags_come_from_the_whole_token_and_the_piece() -> None:
    token = secrets.token_bytes(16)
    assert piece_tag(token, 0) == piece_tag(bytes(token), 0)
    assert piece_tag(token, 0) != piece_tag(token[:15] + bytes([token[15] ^ 1]), 0)
    assert piece_tag(token, 0) != piece_tag(token, 1)
    with pytest.raises(ValueError, match="token"):
        piece_tag(b"short", 0)


def test_local_backend_matches_the_engine_facing_protocols() -> None:
    hub = LocalTransferHub()
    receiver: KVReceiverLike = LocalKVReceiver(hub, KVCache(LAYOUT, 2, "cpu"))
    sender: KVSenderLike = LocalKVSender(hub)
    assert receiver.bytes_received == sender.bytes_sent == 0


PIECES_LAYOUT = dataclasses.replace(LAYOUT, num_layers=5)


@pytest.fixture
def layered() -> Pair:
    """Like `pair`, with 5 layers and a receiver expecting 3 pieces (layers [0], [1, 2], [3, 4])."""
    return _pair(PIECES_LAYOUT, num_pieces=3)


def test_layer_groups_split_evenly_and_refuse_bad_counts() -> None:
    assert layer_groups(5, 3) == (range(0, 1), range(1, 3), range(3, 5))
    assert layer_groups(30, 1) == (range(0, 30),)
    for bad in (0, 6):
        with pytest.raises(ValueError, match="num_pieces"):
            layer_groups(5, bad)


def test_pieces_land_exactly_once_all_are_there(layered: Pair) -> None:
    sender, receiver, source, target = layered
    descriptor = receiver.expect("r", DST, PIECES_LAYOUT)
    sending = sender.open(descriptor, source, SRC, 9)
    for piece in (2, 0):
        sending.push(piece)
    assert receiver.poll("r") is TransferState.PENDING and not target.tensor.any()
    sending.push(1)
    result = sending.done().result()
    assert receiver.poll("r") is TransferState.DONE
    assert torch.equal(target.tensor[:, :, DST], source.tensor[:, :, SRC])
    assert result.nbytes == receiver.bytes_received == descriptor.nbytes
    assert sender.pieces_sent == 3


def test_a_wrong_token_piece_never_lands(layered: Pair) -> None:
    sender, receiver, source, target = layered
    descriptor = receiver.expect("r", DST, PIECES_LAYOUT)
    forged = dataclasses.replace(descriptor, token=secrets.token_bytes(16))
    sender.open(forged, source, SRC, 9).push(1)
    real = sender.open(descriptor, source, SRC, 9)
    real.push(0)
    real.push(2)
    assert receiver.poll("r") is TransferState.PENDING and not target.tensor.any()
    real.push(1)
    assert receiver.poll("r") is TransferState.DONE


def test_unpushed_or_repeated_pieces_fail_the_send(layered: Pair) -> None:
    sender, receiver, source, _ = layered
    descriptor = receiver.expect("r", DST, PIECES_LAYOUT)
    sending = sender.open(descriptor, source, SRC, 9)
    sending.push(0)
    sending.push(0)
    with pytest.raises(ValueError, match="piece: 0 pushed twice"):
        sending.done().result()
    with pytest.raises(TransferError, match=r"pieces \[0, 1, 2\] were never pushed"):
        sender.open(descriptor, source, SRC, 9).done().result()
    with pytest.raises(ValueError, match="num_pieces"):
        sender.open(dataclasses.replace(descriptor, num_pieces=6), source, SRC, 9)


INT8_LAYOUT = dataclasses.replace(PIECES_LAYOUT, dtype="int8")


def test_int8_blocks_travel_with_their_scales_in_pieces() -> None:
    """An int8 cache's rows end in their scales: whole blocks move byte-exact, scales included,
    and bytes per block are (head_dim + 4) int8 bytes per row."""
    hub = LocalTransferHub()
    source, target = KVCache(INT8_LAYOUT, 12, "cpu"), KVCache(INT8_LAYOUT, 12, "cpu")
    floats = torch.randn((*source.tensor.shape[:-1], 8), generator=torch.Generator().manual_seed(0))
    source.tensor.copy_(quantize(floats))
    sender, receiver = LocalKVSender(hub), LocalKVReceiver(hub, target, 3)
    descriptor = receiver.expect("r", DST, INT8_LAYOUT)
    sending = sender.open(descriptor, source, SRC, 9)
    for piece in range(3):
        sending.push(piece)
    assert sending.done().result().nbytes == 3 * INT8_LAYOUT.block_nbytes
    assert receiver.poll("r") is TransferState.DONE
    assert INT8_LAYOUT.block_nbytes == 5 * 2 * 4 * 3 * (8 + 4)
    landed = dequantize(target.tensor[:, :, DST], torch.float32)
    assert torch.equal(landed, dequantize(source.tensor[:, :, SRC], torch.float32))
    with pytest.raises(LayoutMismatchError, match="dtype='bfloat16'"):
        receiver.expect("other", [0], PIECES_LAYOUT)  # int8 and float tiers never exchange KV
