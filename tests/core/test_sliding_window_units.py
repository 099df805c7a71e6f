"""Sliding-window paging, one mechanism at a time, on the KV-cache manager alone (no model): what
slides out, what a swap moves, what a reservation holds, which cached blocks a prefix hit needs,
and which configs say a model slides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.kv.cache import KVLayout
from pdserve.core.kv.manager import KVCacheManager
from pdserve.core.kv.sliding_window import (
    NULL_BLOCK,
    first_live_block,
    first_visible_position,
    live_blocks,
    max_live_blocks,
    readable_table,
)
from pdserve.core.model.config import UnsupportedModelError, load_model_config
from pdserve.core.request import Request
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.transfer.interface import TransferDescriptor

BLOCK = 4
WINDOW = 10


def _manager(num_blocks: int = 32, window: int | None = WINDOW) -> KVCacheManager:
    config = EngineConfig(block_size=BLOCK, num_kv_blocks=num_blocks, num_swap_blocks=16)
    manager = KVCacheManager(config, window)
    manager.cache_root = b"root"
    return manager


def _request(num_tokens: int, request_id: str = "r") -> Request:
    return Request(
        request_id, list(range(100, 100 + num_tokens)), SamplingParams(max_tokens=4), 0, 0.0
    )


def _compute(manager: KVCacheManager, request: Request, num_new: int) -> None:
    """What a step does to the request's blocks: grow, forward (nothing here), record, slide."""
    assert manager.grow(request, num_new, [])
    before = request.num_computed_tokens
    request.num_computed_tokens += num_new
    manager.cache_filled(request, before)
    manager.slide(request)


def test_the_window_rule() -> None:
    # A query at p sees p - W < k <= p: the next one, at 25, sees 16..25 (block 4 on).
    assert first_visible_position(25, WINDOW) == 16
    assert first_live_block(25, WINDOW, BLOCK) == 4
    assert first_visible_position(5, WINDOW) == 0 and first_visible_position(99, None) == 0
    assert max_live_blocks(WINDOW, BLOCK) == 4  # keys 16..24 and the write at 25: blocks 4..6
    assert max_live_blocks(WINDOW, BLOCK, num_new=8) == 5
    assert readable_table([NULL_BLOCK, NULL_BLOCK, 7, 3]) == [0, 0, 7, 3]


def test_blocks_behind_the_window_go_back_to_the_pool() -> None:
    manager = _manager()
    request = _request(100)
    _compute(manager, request, 100)  # one prompt chunk: 25 blocks, then the window slides
    first = first_live_block(100, WINDOW, BLOCK)  # 22: the next query (100) sees 91..100
    assert request.block_ids[:first] == [NULL_BLOCK] * first
    assert len(live_blocks(request.block_ids)) == 25 - first == manager.block_pool.num_used
    assert manager.num_window_freed_blocks == first
    for token in range(40):  # decoding: never more than the window's blocks
        request.output_token_ids.append(token)
        _compute(manager, request, 1)
        assert len(live_blocks(request.block_ids)) <= max_live_blocks(WINDOW, BLOCK)
    manager.free(request)
    assert manager.block_pool.num_free == manager.block_pool.num_blocks


def test_without_a_window_nothing_slides() -> None:
    manager = _manager(window=None)
    request = _request(100)
    _compute(manager, request, 100)
    assert NULL_BLOCK not in request.block_ids and manager.num_window_freed_blocks == 0


def test_swap_moves_only_the_blocks_in_use_and_puts_them_back_in_their_slots() -> None:
    manager = _manager()
    request = _request(50)
    _compute(manager, request, 50)
    live = live_blocks(request.block_ids)
    slid = len(request.block_ids) - len(live)
    pairs = manager.swap_out(request, list(request.block_ids))
    assert pairs is not None and [source for source, _ in pairs] == live
    assert request.block_ids == [NULL_BLOCK] * slid
    assert manager.block_pool.num_used == 0 and manager.swap_pool.num_used == len(live)
    back = manager.swap_in(request)
    assert len(back) == len(live) and request.block_ids[:slid] == [NULL_BLOCK] * slid
    assert request.block_ids[slid:] == [device for _, device in back]
    manager.release_swapped_in()
    manager.free(request)
    assert manager.swap_pool.num_used == manager.block_pool.num_used == 0


def test_a_prefix_hit_needs_only_the_cached_blocks_of_its_window() -> None:
    """The blocks before the window were evicted; the hash of each block is that of its tokens
    and all before them, so the window's blocks alone still prove the prefix."""
    manager = _manager(num_blocks=10)
    first_run = _request(40, "a")
    _compute(manager, first_run, 40)
    manager.free(first_run)  # all ten blocks cached, the early ones least recently freed
    evicting = manager.block_pool.allocate(5)
    assert evicting is not None and manager.block_pool.num_evictions == 5
    manager.block_pool.free(evicting)
    repeat = _request(40, "b")
    repeat.prompt_token_ids.append(7)  # 41 tokens: all 10 full blocks are usable
    assert manager.take_cached_prefix(repeat) == 40
    first = first_live_block(40, WINDOW, BLOCK)
    assert repeat.block_ids[:first] == [NULL_BLOCK] * first
    assert len(live_blocks(repeat.block_ids)) == 10 - first
    manager.free(repeat)
    # Full attention's lookup, which needs every block from the first, finds nothing.
    assert manager.block_pool.cached_prefix(first_run.block_hashes) == []


def test_a_reservation_holds_only_the_window_of_its_first_decode() -> None:
    manager = _manager()
    request = _request(50)
    assert manager.allocate_prompt(request)
    first = first_live_block(50, WINDOW, BLOCK)  # decode's first query is at 50
    assert manager.num_slid_blocks(request) == first
    assert len(request.block_ids) == 13 and len(live_blocks(request.block_ids)) == 13 - first
    manager.free(request)
    assert manager.block_pool.num_used == 0


def test_a_reservation_keeps_only_cached_blocks_inside_its_window() -> None:
    manager = _manager()
    first_run = _request(40, "a")
    _compute(manager, first_run, 40)
    manager.free(first_run)
    longer = _request(48, "b")  # the same 40 tokens and 8 more
    assert manager.allocate_prompt(longer)
    first = first_live_block(48, WINDOW, BLOCK)
    assert longer.num_computed_tokens == 40 and manager.num_slid_blocks(longer) == first
    assert len(live_blocks(longer.block_ids)) == 12 - first
    manager.count_reservation(longer)
    assert manager.num_reused_blocks == 10 - first  # cached and in the window: never travel
    manager.free(longer)


def test_the_descriptor_names_the_positions_its_blocks_hold() -> None:
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, block_size=16, dtype="float32")
    descriptor = TransferDescriptor("r", b"", (5, 6, 7), layout, bytes(16), 1, 2, 29)
    assert descriptor.first_block == 29 and descriptor.first_position == 29 * 16


def _config(tmp_path: Path, **raw: Any) -> Path:
    base = {
        "architectures": [raw.pop("architecture", "MistralForCausalLM")],
        "vocab_size": 8,
        "hidden_size": 8,
        "intermediate_size": 8,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps({**base, **raw}))
    return tmp_path


def test_which_configs_slide(tmp_path: Path) -> None:
    def window(**raw: Any) -> int | None:
        return load_model_config(_config(tmp_path, **raw)).sliding_window

    qwen2 = "Qwen2ForCausalLM"
    assert window(sliding_window=32) == 32
    assert window(sliding_window=None) is None
    assert window(architecture=qwen2, sliding_window=32, use_sliding_window=False) is None
    both = {"architecture": qwen2, "sliding_window": 32, "use_sliding_window": True}
    assert window(**both, max_window_layers=0) == 32
    assert window(**both, max_window_layers=3) is None  # no layer from 3 on: none slides
    with pytest.raises(UnsupportedModelError, match="mixing"):
        window(**both, max_window_layers=1)
    full = ["full_attention"] * 3
    assert window(**both, layer_types=full) is None
    with pytest.raises(UnsupportedModelError, match="mixing"):
        window(**both, layer_types=["sliding_attention", *full[1:]])
