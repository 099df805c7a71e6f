"""`--kv-staging device`: the staging buffer on the KV cache's own device. On CPU tiers it is the
host path under another name (tested here on every machine); between GPU tiers UCX moves device
memory (cuda_copy / cuda_ipc) and the KV never passes through host memory (`gpu` tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from ucx_peers import LAYOUT, Peer

SRC_BLOCKS = [3, 7, 1]
DST_BLOCKS = [10, 2, 5]
NUM_TOKENS = 40
WAIT_S = 20.0
CUDA_TLS = "cuda_copy,cuda_ipc,sm,self"


def _pair(tls: str, device: str, staging: str) -> Iterator[tuple[Peer, Peer]]:
    started: list[Peer] = []
    try:
        started.append(Peer("decode", tls, device=device, staging=staging))
        started.append(Peer("prefill", tls, device=device, staging=staging))
        yield started[1], started[0]
    finally:
        for peer in started:
            peer.stop()


def _lands_exactly(prefill: Peer, decode: Peer) -> None:
    source = prefill.call("cache")
    descriptor = decode.call("expect", "staged", DST_BLOCKS, LAYOUT)
    result = prefill.call("send", descriptor, SRC_BLOCKS, NUM_TOKENS)
    assert decode.call("wait", "staged", WAIT_S) == "done"
    after = decode.call("cache")
    bits = torch.int32
    assert torch.equal(after[:, :, DST_BLOCKS].view(bits), source[:, :, SRC_BLOCKS].view(bits))
    assert result.nbytes == len(DST_BLOCKS) * LAYOUT.block_nbytes
    decode.call("cancel", "staged")
    assert decode.call("tracked") == 0


def test_device_staging_on_cpu_tiers_lands_exactly() -> None:
    for prefill, decode in _pair("sm,self", "cpu", "device"):
        _lands_exactly(prefill, decode)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("staging", ["device", "host"])
def test_gpu_tiers_hand_kv_over_with_either_staging(staging: str) -> None:
    for prefill, decode in _pair(CUDA_TLS, "cuda", staging):
        _lands_exactly(prefill, decode)
