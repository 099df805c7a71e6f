"""Prefix caching through `pdserve.LLM`: reused blocks give exactly the tokens computed ones do.

Prompts share a leading "system prompt" of 0, a partial block's and many blocks' worth of tokens,
with distinct tails; each scenario runs them twice (the second pass finds the first pass's blocks
cached) with the cache on (and off once), and every output must equal transformers' greedy tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.serving.cli_config import add_engine_arguments, engine_config_from_args
from tests.core.test_greedy_matches_hf import SCENARIOS, assert_engine_empty
from tests.oracle import SHARED_MAX_TOKENS

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

# The cache on under every scheduling path; off once (test_greedy_matches_hf covers the rest).
CASES = [(scenario, True) for scenario in SCENARIOS] + [("roomy", False)]


@pytest.mark.parametrize(("scenario", "caching"), CASES)
def test_cached_prefixes_give_transformers_tokens(
    scenario: str,
    caching: bool,
    model_dir: Path,
    shared_prompts: list[list[int]],
    shared_hf_greedy: list[list[int]],
) -> None:
    config = SCENARIOS[scenario]
    llm = LLM(model_dir, **{**vars(config), "enable_prefix_caching": caching})
    params = SamplingParams(max_tokens=SHARED_MAX_TOKENS, temperature=0)
    for _ in range(2):  # the second pass reuses the first pass's blocks where they survived
        outputs = llm.generate(shared_prompts, params)
        assert [list(out.outputs[0].token_ids) for out in outputs] == shared_hf_greedy
        assert_engine_empty(llm)
    stats = llm.engine.stats()
    assert (stats.num_prefix_hit_tokens > 0) == caching
    if not caching:
        assert stats.num_cached_blocks == 0


def test_repeated_prompt_reuses_all_but_its_last_token(
    model_dir: Path, shared_prompts: list[list[int]]
) -> None:
    """A prompt seen before computes only its last block (its last token's logits are needed)."""
    llm = LLM(model_dir, num_kv_blocks=64)
    prompt = shared_prompts[-1]  # 140 tokens: 8 full blocks and 12 tokens
    params = SamplingParams(max_tokens=4, temperature=0)
    first = llm.generate(prompt, params)
    before = llm.engine.stats()
    again = llm.generate(prompt, params)
    after = llm.engine.stats()
    assert again[0].outputs[0].token_ids == first[0].outputs[0].token_ids
    assert after.num_prefix_hit_tokens - before.num_prefix_hit_tokens == 8 * 16
    assert after.num_prefix_query_tokens - before.num_prefix_query_tokens == len(prompt)


def test_cache_evicts_least_recently_freed_only_when_blocks_run_out(model_dir: Path) -> None:
    """A pool of 8 blocks: two 4-block prompts stay cached together; a third evicts the older."""
    llm = LLM(model_dir, num_kv_blocks=8, num_swap_blocks=0)
    params = SamplingParams(max_tokens=1, temperature=0)
    a, b, c = ([token] * 64 for token in (11, 12, 13))  # four full blocks each
    llm.generate(a, params)
    llm.generate(b, params)
    stats = llm.engine.stats()
    assert (stats.num_cached_blocks, stats.num_cache_evictions) == (8, 0)
    llm.generate(c, params)
    stats = llm.engine.stats()
    assert (stats.num_cached_blocks, stats.num_cache_evictions) == (8, 4)  # all of a's
    llm.generate(b, params)  # b was freed after a, so it survived: three blocks reused
    assert llm.engine.stats().num_prefix_hit_tokens - stats.num_prefix_hit_tokens == 3 * 16
    stats = llm.engine.stats()
    llm.generate(a, params)
    assert llm.engine.stats().num_prefix_hit_tokens == stats.num_prefix_hit_tokens


def test_prefix_caching_flag_is_checked() -> None:
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        EngineConfig(enable_prefix_caching="yes")  # type: ignore[arg-type]


def test_no_prefix_cache_flag_and_env_turn_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def parsed(*argv: str) -> EngineConfig:
        parser = argparse.ArgumentParser()
        add_engine_arguments(parser)
        return engine_config_from_args(parser.parse_args(argv))

    assert parsed().enable_prefix_caching
    assert not parsed("--no-prefix-cache").enable_prefix_caching
    monkeypatch.setenv("PDSERVE_NO_PREFIX_CACHE", "true")
    assert not parsed().enable_prefix_caching
