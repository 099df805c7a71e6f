"""n > 1 through `pdserve.LLM`: the samples share the prompt's blocks (copy-on-write), and each one
gives exactly the tokens of a single-sample request with its derived seed (`seed + index`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.core.llm import LLM
from pdserve.core.sampling_params import InvalidRequestError, SamplingParams
from tests.core.test_greedy_matches_hf import SCENARIOS, assert_engine_empty

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

N = 4


def _sampled(seed: int, n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=12, temperature=0.9, top_k=40, seed=seed, n=n, ignore_eos=True)


@pytest.mark.parametrize("scenario", ["roomy", "swap", "recompute"])
def test_each_sample_equals_a_single_run_with_its_derived_seed(
    scenario: str, model_dir: Path, prompts: list[list[int]]
) -> None:
    config = vars(SCENARIOS[scenario])
    prompt = prompts[4]  # 63 tokens: the forks share 3 full blocks and copy the 4th
    llm = LLM(model_dir, **config)
    singles = llm.generate([prompt] * N, [_sampled(100 + i) for i in range(N)])
    assert_engine_empty(llm)
    # Two requests of n samples and a plain one, so forks run next to others (and under pressure).
    many, one, again = llm.generate(
        [prompt, prompts[5], prompt], [_sampled(100, N), _sampled(7), _sampled(100, N)]
    )
    assert [sample.index for sample in many.outputs] == list(range(N))
    assert len(one.outputs) == 1
    tokens = [sample.token_ids for sample in many.outputs]
    assert tokens == [single.outputs[0].token_ids for single in singles]
    assert [sample.token_ids for sample in again.outputs] == tokens
    assert len(set(tokens)) > 1, "samples with different seeds should differ"
    assert_engine_empty(llm)


def test_greedy_samples_all_equal_transformers(
    model_dir: Path, prompts: list[list[int]], hf_greedy: list[list[int]], max_new_tokens: int
) -> None:
    llm = LLM(model_dir, num_kv_blocks=64)
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0, n=3)
    outputs = llm.generate(prompts[2:4], params)
    assert len(outputs) == 2  # one per prompt, its 3 samples inside (vLLM's shape)
    assert [[list(sample.token_ids) for sample in out.outputs] for out in outputs] == [
        [expected] * 3 for expected in hf_greedy[2:4]
    ]
    assert [[sample.index for sample in out.outputs] for out in outputs] == [[0, 1, 2]] * 2
    assert [list(out.prompt_token_ids) for out in outputs] == prompts[2:4]
    assert_engine_empty(llm)


def test_n_samples_hold_fewer_blocks_than_n_requests(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    """Peak blocks in use: 8 samples of a 250-token prompt vs 8 separate requests of it."""
    peaks = []
    for params in ([_sampled(1, 8)], [_sampled(1 + i) for i in range(8)]):
        llm = LLM(model_dir, num_kv_blocks=256, enable_prefix_caching=False)
        for index, sampling in enumerate(params):
            llm.engine.add_request(prompts[6], sampling, str(index))
        peak = 0
        while llm.engine.has_unfinished():
            llm.engine.step()
            peak = max(
                peak, llm.engine.stats().num_total_blocks - llm.engine.stats().num_free_blocks
            )
        peaks.append(peak)
    shared, separate = peaks
    # 250 prompt + 11 computed output tokens in 16-token blocks: 17 blocks each, 136 for eight.
    assert separate == 8 * 17
    # Shared: the 15 full prompt blocks; each sample's own partial 16th (7 copies and the
    # original) and 17th block.
    assert shared == 15 + 8 * 2


def test_abort_of_an_n_request_frees_every_shared_block(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    llm = LLM(model_dir, num_kv_blocks=64)
    llm.engine.add_request(prompts[5], _sampled(3, N), "many")
    llm.engine.add_request(prompts[5], _sampled(4), "one")
    for _ in range(4):  # past the fork: the samples hold shared blocks
        llm.engine.step()
    assert llm.engine.scheduler.kv_manager.block_pool.num_used > 0
    llm.engine.abort("many")
    llm.engine.abort("one")
    assert_engine_empty(llm)


def test_n_is_checked() -> None:
    with pytest.raises(InvalidRequestError, match=r"^n:"):
        SamplingParams(n=0)
