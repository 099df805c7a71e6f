"""KV offload through `pdserve.LLM` and the real model: between two passes over the same prompts
every cached block is evicted from the pool, so the second pass finds its prefixes only in the
tiers below (host memory, disk, both), takes them back and gives transformers' greedy tokens, as
does a worker restarted on its disk folder; a sliding-window model and an int8 cache the same
against their own references."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams
from tests.core.test_greedy_matches_hf import assert_engine_empty
from tests.core.test_sliding_window_greedy import generate_watched
from tests.oracle import SHARED_MAX_TOKENS

TIERS: dict[str, dict[str, Any]] = {
    "none": {},
    "host": {"kv_offload_host_gb": 0.2},
    "disk": {"kv_offload_disk_gb": 0.2},
    "host+disk": {"kv_offload_host_gb": 0.01, "kv_offload_disk_gb": 0.2},
}
GREEDY = SamplingParams(max_tokens=SHARED_MAX_TOKENS, temperature=0)


def offload_llm(model_dir: Path, tiers: str, disk: Path, **config: Any) -> LLM:
    options = dict(TIERS[tiers])
    if "kv_offload_disk_gb" in options:
        options["kv_offload_disk_path"] = str(disk)
    return LLM(model_dir, **{"num_kv_blocks": 128, **options, **config})


def evict_every_cached_block(llm: LLM) -> None:
    """Takes every free block and gives it back: the pool's cached prefixes are evicted (and
    demoted, when tiers are below) as a busy worker's would be."""
    pool = llm.engine.scheduler.kv_manager.block_pool
    taken = pool.allocate(pool.num_free)
    assert taken is not None and pool.num_cached_blocks == 0
    pool.free(taken)


def twice_around_an_eviction(
    llm: LLM,
    prompts: list[list[int]],
    expected: list[list[int]],
    generate: Callable[[LLM, list[list[int]]], list[list[int]]] | None = None,
) -> None:
    """The prompts, every cached block evicted, the prompts again: both passes as expected."""
    run = generate or greedy
    assert run(llm, prompts) == expected
    evict_every_cached_block(llm)
    assert run(llm, prompts) == expected


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, GREEDY)]


def promoted(llm: LLM) -> int:
    offload = llm.engine.offload
    return 0 if offload is None else sum(offload.stats.promoted_blocks.values())


@pytest.mark.parametrize("tiers", list(TIERS))
def test_prefixes_come_back_from_below_with_transformers_tokens(
    tiers: str,
    model_dir: Path,
    shared_prompts: list[list[int]],
    shared_hf_greedy: list[list[int]],
    tmp_path: Path,
) -> None:
    llm = offload_llm(model_dir, tiers, tmp_path)
    assert greedy(llm, shared_prompts) == shared_hf_greedy
    evict_every_cached_block(llm)
    hits_before = llm.engine.stats().num_prefix_hit_tokens
    assert greedy(llm, shared_prompts) == shared_hf_greedy
    hits = llm.engine.stats().num_prefix_hit_tokens - hits_before
    assert_engine_empty(llm)
    llm.close()
    # Every full block but the one holding a prompt's last token was found, in the pool (the
    # prompts' shared prefix, once computed or promoted) or below.
    reusable = sum((len(prompt) - 1) // 16 * 16 for prompt in shared_prompts)
    if tiers == "none":
        assert promoted(llm) == 0 and hits < reusable
    else:
        assert promoted(llm) > 0 and hits == reusable


def test_speculative_steps_write_no_partial_block_down(
    model_dir: Path,
    shared_prompts: list[list[int]],
    shared_hf_greedy: list[list[int]],
    tmp_path: Path,
) -> None:
    """n-gram drafts write KV past the verified tokens and roll back; only registered blocks
    (full, verified) move down, so the second pass is exact."""
    llm = offload_llm(model_dir, "host+disk", tmp_path, speculative="ngram")
    twice_around_an_eviction(llm, shared_prompts, shared_hf_greedy)
    assert promoted(llm) > 0 and llm.engine.stats().num_drafted_tokens > 0
    assert_engine_empty(llm)
    llm.close()


def test_a_worker_restarted_on_its_disk_folder_reuses_the_blocks(
    model_dir: Path,
    shared_prompts: list[list[int]],
    shared_hf_greedy: list[list[int]],
    tmp_path: Path,
) -> None:
    first = offload_llm(model_dir, "disk", tmp_path)
    assert greedy(first, shared_prompts) == shared_hf_greedy
    evict_every_cached_block(first)
    first.close()  # the writer lands what it holds
    again = offload_llm(model_dir, "disk", tmp_path)
    assert greedy(again, shared_prompts) == shared_hf_greedy
    assert again.engine.stats().num_prefix_hit_tokens > 0
    assert promoted(again) >= len(shared_prompts)
    again.close()


def test_an_int8_cache_reuses_its_own_blocks_only(
    model_dir: Path, shared_prompts: list[list[int]], tmp_path: Path
) -> None:
    """int8 blocks hash under their own root: a float32 worker on the same folder finds none."""
    prompts = shared_prompts[-3:]  # the three sharing 100 tokens: six blocks each
    reference = greedy(LLM(model_dir, kv_cache_dtype="int8"), prompts)
    llm = offload_llm(model_dir, "disk", tmp_path, kv_cache_dtype="int8")
    twice_around_an_eviction(llm, prompts, reference)
    assert promoted(llm) > 0
    llm.close()
    float_worker = offload_llm(model_dir, "disk", tmp_path)
    greedy(float_worker, prompts)
    assert promoted(float_worker) == 0
    float_worker.close()


def test_a_sliding_window_model_takes_back_the_blocks_of_its_window(
    window_model_dir: Path,
    prompts: list[list[int]],
    window_hf_greedy: list[list[int]],
    tmp_path: Path,
) -> None:
    llm = LLM(window_model_dir, num_kv_blocks=64, kv_offload_host_gb=0.1)
    twice_around_an_eviction(llm, prompts, window_hf_greedy, generate_watched)
    assert promoted(llm) > 0
    assert_engine_empty(llm)
    llm.close()
