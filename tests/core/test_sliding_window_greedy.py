"""A real sliding-window model (a small Mistral, window 32, and a Qwen2 with
`use_sliding_window`; pdserve/testing/window_model.py): greedy tokens equal transformers' on every
scheduling path, for prompts of 1-500 tokens and 48 new ones, so every sequence runs well past its
window. Meanwhile each sequence holds no more blocks than its window needs, what slid out goes back
to the pool, and nothing is left held at the end.

The through-the-tiers versions are tests/core/test_sliding_window_transfer.py (in-process
transfer) and tests/integration/test_sliding_window_cluster.py (router, UCX).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.kv.sliding_window import live_blocks, max_live_blocks
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams
from pdserve.testing.window_model import QWEN2, build_window_model
from tests.conftest import WINDOW, WINDOW_MAX_TOKENS
from tests.core.test_greedy_matches_hf import assert_engine_empty, assert_scenario_ran
from tests.oracle import transformers_greedy

SCENARIOS = {
    "roomy": EngineConfig(num_kv_blocks=256),
    # 14 blocks: a sliding sequence holds at most 3, eight of them do not fit; 64-token chunks
    # keep a prompt's step within the pool (max_live_blocks(32, 16, 64) = 7).
    "swap": EngineConfig(num_kv_blocks=14, num_swap_blocks=64, max_num_batched_tokens=64),
    "recompute": EngineConfig(num_kv_blocks=14, num_swap_blocks=0, max_num_batched_tokens=64),
    # Chunks that start and end mid-block, each reaching back into the blocks before it.
    "chunked": EngineConfig(num_kv_blocks=256, max_num_batched_tokens=40),
    "speculative": EngineConfig(num_kv_blocks=256, speculative="ngram"),
}
GREEDY = SamplingParams(max_tokens=WINDOW_MAX_TOKENS, temperature=0)


def generate_watched(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy tokens of each prompt, stepping the engine by hand: after every step no sequence
    (running or swapped) holds more blocks than its window needs."""
    engine = llm.engine
    request_ids = [engine.add_request(prompt, GREEDY) for prompt in prompts]
    tokens: dict[str, list[int]] = {request_id: [] for request_id in request_ids}
    bound = max_live_blocks(WINDOW, engine.config.block_size)
    while engine.has_unfinished():
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.new_token_ids)
        scheduler = engine.scheduler
        for request in scheduler.running + scheduler.swapped:
            held = len(live_blocks(request.block_ids)) + len(request.swap_block_ids)
            assert held <= bound, f"{request.request_id} holds {held} blocks"
    return [tokens[request_id] for request_id in request_ids]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sliding_window_greedy_equals_transformers(
    scenario: str,
    window_model_dir: Path,
    prompts: list[list[int]],
    window_hf_greedy: list[list[int]],
) -> None:
    llm = LLM(window_model_dir, **vars(SCENARIOS[scenario]))
    assert llm.engine.model_config.sliding_window == WINDOW
    assert generate_watched(llm, prompts) == window_hf_greedy
    assert_scenario_ran(llm, scenario)
    assert llm.engine.stats().num_window_freed_blocks > 0
    assert_engine_empty(llm)


def test_the_window_decides_the_tokens(
    window_model_dir: Path,
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    prompts: list[list[int]],
    window_hf_greedy: list[list[int]],
) -> None:
    """The same weights attending to everything give other tokens: the tests above would see a
    window applied wrongly (or not at all)."""
    full = build_window_model(tmp_path_factory.mktemp("mistral-full") / "model", model_dir, None)
    long_prompts = [prompt for prompt in prompts if len(prompt) > WINDOW]
    full_greedy = transformers_greedy(full, long_prompts, WINDOW_MAX_TOKENS)
    windowed = [
        out for prompt, out in zip(prompts, window_hf_greedy, strict=True) if prompt in long_prompts
    ]
    assert all(a != b for a, b in zip(full_greedy, windowed, strict=True))


def test_a_repeated_prompt_reuses_its_cached_window(
    window_model_dir: Path, prompts: list[list[int]], window_hf_greedy: list[list[int]]
) -> None:
    """With the prefix cache on, the second run of the same prompts takes the blocks of each
    prompt's window from the cache (the blocks before it went back to the pool and may be gone)
    and still gives transformers' tokens."""
    llm = LLM(window_model_dir, num_kv_blocks=64)
    assert generate_watched(llm, prompts) == window_hf_greedy
    hits_before = llm.engine.stats().num_prefix_hit_tokens
    assert generate_watched(llm, prompts) == window_hf_greedy
    stats = llm.engine.stats()
    assert stats.num_prefix_hit_tokens - hits_before >= len(prompts[-1]) - 16
    assert_engine_empty(llm)


@pytest.fixture(scope="module")
def qwen2_window_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("qwen2-w32") / "model"
    return build_window_model(target, model_dir, WINDOW, architecture=QWEN2)


@pytest.fixture(scope="module")
def qwen2_hf_greedy(qwen2_window_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    return transformers_greedy(qwen2_window_dir, prompts, WINDOW_MAX_TOKENS)


@pytest.mark.parametrize("scenario", ["roomy", "swap"])
def test_qwen2_with_use_sliding_window_equals_transformers(
    scenario: str,
    qwen2_window_dir: Path,
    prompts: list[list[int]],
    qwen2_hf_greedy: list[list[int]],
) -> None:
    llm = LLM(qwen2_window_dir, **vars(SCENARIOS[scenario]))
    assert llm.engine.model_config.sliding_window == WINDOW
    assert generate_watched(llm, prompts) == qwen2_hf_greedy
    assert_scenario_ran(llm, scenario)
    assert_engine_empty(llm)
