"""Sliding-window KV across the tiers with the in-process transfer: decode reserves only the
blocks in the window of its first step, prefill (whose own blocks slide as it prefills) sends only
those, the descriptor says where they start, and the greedy tokens stay transformers'.

The real-process version (router, UCX) is tests/integration/test_sliding_window_cluster.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.kv.sliding_window import first_live_block
from pdserve.core.sampling_params import InvalidRequestError
from pdserve.decode_service.engine import DecodeEngine
from pdserve.prefill_service.engine import PrefillEngine
from tests.conftest import WINDOW
from tests.core.test_cross_tier_prefix import GREEDY, Tiers
from tests.fakes.local_transfer import LocalKVReceiver, LocalKVSender, LocalTransferHub
from tests.oracle import SHARED_MAX_TOKENS

BLOCK = 16


@pytest.fixture(scope="module")
def tiers(window_model_dir: Path) -> Tiers:
    hub = LocalTransferHub()
    # Prefill runs long prompts in 48-token chunks: its blocks slide while it prefills.
    prefill = PrefillEngine(
        window_model_dir,
        EngineConfig(num_kv_blocks=32, max_num_batched_tokens=48),
        LocalKVSender(hub),
    )
    decode = DecodeEngine(
        window_model_dir,
        EngineConfig(num_kv_blocks=32),
        lambda cache: LocalKVReceiver(hub, cache, 2),  # layer-wise: one piece per layer
    )
    return Tiers(prefill, decode)


def test_only_the_window_travels_and_the_tokens_are_transformers(
    tiers: Tiers, prompts: list[list[int]], window_hf_greedy: list[list[int]]
) -> None:
    block_nbytes = int(tiers.decode.layout.block_nbytes)
    for index, prompt in enumerate(prompts):
        destination = tiers.reserve(f"w{index}", prompt)
        slid = first_live_block(len(prompt), WINDOW, BLOCK)
        assert destination.num_slid_blocks == slid
        first = destination.first_block
        assert first == max(slid, destination.num_cached_blocks)
        assert len(destination.block_ids) == blocks_for(len(prompt), BLOCK) - first
        token, sent = tiers.prefill_into(f"w{index}", prompt, destination)
        assert sent == len(destination.block_ids) * block_nbytes
        tokens = tiers.finish(f"w{index}", destination, token)
        assert tokens == window_hf_greedy[index][:SHARED_MAX_TOKENS]
    # The 500-token prompt sent 3 of its 32 blocks (positions 464..499).
    assert first_live_block(500, WINDOW, BLOCK) == 29
    for engine in (tiers.prefill, tiers.decode):
        assert engine.stats().num_window_freed_blocks > 0
    assert tiers.all_free()


def test_prefill_refuses_a_window_other_than_its_models(
    tiers: Tiers, prompts: list[list[int]]
) -> None:
    """A decode tier that reserved the whole prompt (a model without the window) and one that
    skipped too much are both refused before anything runs, naming the field."""
    prompt = prompts[5]  # 130 tokens: blocks 0-5 slid, 6-8 travel
    destination = tiers.reserve("mismatch", prompt)
    for slid in (0, destination.num_slid_blocks + 1):
        wrong = dataclasses.replace(destination, num_slid_blocks=slid)
        with pytest.raises(InvalidRequestError) as caught:
            tiers.prefill.submit("mismatch", prompt, GREEDY, wrong)
        assert caught.value.field == "destination.num_slid_blocks"
    tiers.decode.abort("mismatch")
    assert tiers.all_free()
