"""`LLM(kv_cache_dtype="int8")`: K/V stored as int8 rows with scales, through every engine path.

int8 greedy tokens are not transformers' tokens (the cache rounds K and V), so the oracle here is
int8 itself: the run is deterministic, and swap, recompute, chunked prefill and the prefix cache
move or recompute the very same int8 rows (scales inside the blocks), so each must give exactly
the tokens of the roomy int8 run, and leak nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from pdserve.core.config import EngineConfig
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.serving.cli_config import add_engine_arguments, engine_config_from_args
from tests.core.test_greedy_matches_hf import SCENARIOS, assert_engine_empty
from tests.oracle import SHARED_MAX_TOKENS

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

GREEDY = SamplingParams(max_tokens=24, temperature=0)


def _int8(model_dir: Path, scenario: str) -> LLM:
    return LLM(model_dir, **{**vars(SCENARIOS[scenario]), "kv_cache_dtype": "int8"})


def _tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def roomy_int8(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    llm = _int8(model_dir, "roomy")
    cache = llm.engine.runner.kv_cache
    assert cache.tensor.dtype == torch.int8 and cache.layout.dtype == "int8"
    tokens = _tokens(llm, prompts, GREEDY)
    assert_engine_empty(llm)
    return tokens


def test_int8_generates_close_to_transformers(
    roomy_int8: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """Not equal (rounding may flip a near-tie), but the first tokens come from the same model:
    every prompt's first greedy token agrees with transformers' on this real text."""
    assert [len(tokens) for tokens in roomy_int8] == [len(tokens) for tokens in hf_greedy]
    assert [tokens[0] for tokens in roomy_int8] == [tokens[0] for tokens in hf_greedy]


@pytest.mark.parametrize("scenario", ["swap", "recompute", "chunked"])
def test_preemption_and_chunking_give_the_roomy_int8_tokens(
    scenario: str, model_dir: Path, prompts: list[list[int]], roomy_int8: list[list[int]]
) -> None:
    llm = _int8(model_dir, scenario)
    assert _tokens(llm, prompts, GREEDY) == roomy_int8
    scheduler = llm.engine.scheduler
    if scenario == "swap":
        assert scheduler.num_swaps_out > 0
        assert llm.engine.runner.swap_cache is not None
        assert llm.engine.runner.swap_cache.tensor.dtype == torch.int8
    if scenario == "recompute":
        assert scheduler.num_preemptions > 0 and scheduler.num_swaps_out == 0
    assert_engine_empty(llm)


def test_prefix_cache_on_and_off_agree_under_int8(
    model_dir: Path, shared_prompts: list[list[int]]
) -> None:
    params = SamplingParams(max_tokens=SHARED_MAX_TOKENS, temperature=0)
    uncached = LLM(model_dir, num_kv_blocks=256, kv_cache_dtype="int8", enable_prefix_caching=False)
    expected = _tokens(uncached, shared_prompts, params)
    cached = LLM(model_dir, num_kv_blocks=256, kv_cache_dtype="int8")
    for _ in range(2):  # the second pass reads the first pass's int8 blocks from the cache
        assert _tokens(cached, shared_prompts, params) == expected
        assert_engine_empty(cached)
    assert cached.engine.stats().num_prefix_hit_tokens > 0


def test_int8_blocks_are_68_of_256_bytes_per_row_of_fp32(model_dir: Path) -> None:
    fp32 = LLM(model_dir, num_kv_blocks=4, num_swap_blocks=0).engine.layout
    int8 = LLM(model_dir, num_kv_blocks=4, num_swap_blocks=0, kv_cache_dtype="int8").engine.layout
    assert (fp32.dtype, int8.dtype) == ("float32", "int8")
    assert fp32.head_dim == 64
    assert int8.block_nbytes * 256 == fp32.block_nbytes * 68


def test_a_bad_kv_cache_dtype_is_refused_naming_the_field(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(model_dir, kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="float32")  # the model's dtype is "auto", said one way


def test_kv_cache_dtype_flag_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    def parsed(*argv: str) -> EngineConfig:
        parser = argparse.ArgumentParser()
        add_engine_arguments(parser)
        return engine_config_from_args(parser.parse_args(argv))

    assert (parsed().kv_cache_dtype, parsed().kv_dtype) == ("auto", "float32")
    assert parsed("--kv-cache-dtype", "int8").kv_dtype == "int8"
    with pytest.raises(SystemExit):
        parsed("--kv-cache-dtype", "int4")
    monkeypatch.setenv("PDSERVE_KV_CACHE_DTYPE", "int8")
    assert parsed().kv_cache_dtype == "int8"
