"""The prefill engine pushes each group of layers from inside the forward pass: when piece p is
delivered, the prompt's K/V of the later groups is not yet written; decode's blocks then equal
prefill's, byte for byte (greedy output through real processes: tests/integration)."""

from __future__ import annotations

from pathlib import Path

import torch

from pdserve.core.config import EngineConfig
from pdserve.core.kv.cache import KVCache
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.transfer.interface import TransferDescriptor, TransferState, layer_groups
from pdserve.core.transfer.staging import Piece
from pdserve.prefill_service.engine import PrefillEngine
from tests.fakes.local_transfer import LocalKVReceiver, LocalKVSender, LocalTransferHub

NUM_PIECES = 4


class _RecordingHub(LocalTransferHub):
    """Notes, per delivered piece, which layers of the prompt's source blocks hold K/V already."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: PrefillEngine | None = None
        self.src_blocks: list[int] = []
        self.written_at_delivery: list[tuple[int, list[bool]]] = []

    def deliver(self, descriptor: TransferDescriptor, number: int, piece: Piece) -> None:
        assert self.engine is not None
        self.src_blocks = list(self.engine.requests[descriptor.request_id].block_ids)
        blocks = self.engine.runner.kv_cache.tensor[:, :, self.src_blocks]
        written = [bool(blocks[layer].any()) for layer in range(blocks.shape[0])]
        self.written_at_delivery.append((number, written))
        super().deliver(descriptor, number, piece)


def test_pieces_leave_during_the_forward_and_land_exactly(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    hub = _RecordingHub()
    engine = PrefillEngine(model_dir, EngineConfig(num_kv_blocks=64), LocalKVSender(hub))
    hub.engine = engine
    decode_cache = KVCache(engine.layout, 64, "cpu")
    receiver = LocalKVReceiver(hub, decode_cache, num_pieces=NUM_PIECES)
    prompt = prompts[-2]  # 250 tokens: 16 blocks
    blocks = list(range(40, 40 + -(-len(prompt) // engine.layout.block_size)))
    destination = receiver.expect("r", blocks, engine.layout)
    outcome = engine.submit("r", prompt, SamplingParams(max_tokens=1), destination)
    while not outcome.done():
        engine.step()

    assert outcome.result().kv_bytes_sent == destination.nbytes
    groups = layer_groups(engine.layout.num_layers, NUM_PIECES)
    assert [number for number, _ in hub.written_at_delivery] == list(range(NUM_PIECES))
    for number, written in hub.written_at_delivery:
        assert all(written[: groups[number].stop]) and not any(written[groups[number].stop :])
    assert receiver.poll("r") is TransferState.DONE
    landed = decode_cache.tensor[:, :, list(destination.block_ids)]
    assert torch.equal(landed, engine.runner.kv_cache.tensor[:, :, hub.src_blocks])
