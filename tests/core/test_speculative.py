"""Speculative decoding through `pdserve.LLM`: with n-gram drafts on, greedy tokens are
transformers' under every scheduling path (swap, recompute, chunked prefill, the prefix cache,
n > 1); a seeded sampled request draws the same tokens as without drafts; nothing leaks.

The prompts are real text repeated (tests/conftest.py), so the n-gram proposer finds matches and
the model keeps many drafts: each test checks that drafts were verified and kept, so none passes
with speculation silently off.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams
from pdserve.decode_service.engine import DecodeEngine, DecodeLimits
from pdserve.prefill_service.engine import PrefillEngine
from tests.core.test_greedy_matches_hf import SCENARIOS, assert_engine_empty, assert_scenario_ran
from tests.fakes.local_transfer import LocalKVReceiver, LocalKVSender, LocalTransferHub
from tests.oracle import SHARED_MAX_TOKENS

pytestmark = pytest.mark.slow  # not in the edit-loop subset (README, Tests)

SPEC = {"speculative": "ngram", "num_speculative_tokens": 4}


def assert_drafts_kept(llm: LLM) -> None:
    stats = llm.engine.stats()
    assert 0 < stats.num_accepted_tokens <= stats.num_drafted_tokens


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_with_drafts_equals_transformers(
    scenario: str,
    model_dir: Path,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    if scenario in ("swap", "recompute"):
        # Drafts finish requests in fewer steps: the eight prompts alone no longer fill the
        # small pool, three copies of the four longest do.
        prompts, hf_greedy = prompts[4:] * 3, hf_greedy[4:] * 3
    llm = LLM(model_dir, **{**vars(SCENARIOS[scenario]), **SPEC})
    outputs = llm.generate(prompts, SamplingParams(max_tokens=max_new_tokens, temperature=0))

    assert [list(out.outputs[0].token_ids) for out in outputs] == hf_greedy
    assert_drafts_kept(llm)
    assert_scenario_ran(llm, scenario)
    assert_engine_empty(llm)


def test_cached_prefixes_with_drafts_give_transformers_tokens(
    model_dir: Path, shared_prompts: list[list[int]], shared_hf_greedy: list[list[int]]
) -> None:
    llm = LLM(model_dir, num_kv_blocks=256, **SPEC)
    params = SamplingParams(max_tokens=SHARED_MAX_TOKENS, temperature=0)
    for _ in range(2):  # the second pass reuses the first pass's blocks
        outputs = llm.generate(shared_prompts, params)
        assert [list(out.outputs[0].token_ids) for out in outputs] == shared_hf_greedy
        assert_engine_empty(llm)
    assert llm.engine.stats().num_prefix_hit_tokens > 0
    assert_drafts_kept(llm)


def test_cached_output_blocks_hold_only_verified_tokens(
    model_dir: Path, prompts: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """A prompt that continues an earlier answer reuses the blocks that answer filled, drafts
    and all: had a rejected draft's KV been cached, the continuation would go astray."""
    llm = LLM(model_dir, num_kv_blocks=128, **SPEC)
    prompt, expected = prompts[6], hf_greedy[6]  # 250 tokens: the answer fills a block
    greedy = SamplingParams(max_tokens=len(expected), temperature=0)
    assert list(llm.generate(prompt, greedy)[0].outputs[0].token_ids) == expected
    before = llm.engine.stats().num_prefix_hit_tokens
    continued = llm.generate(prompt + expected[:16], SamplingParams(max_tokens=8, temperature=0))
    assert list(continued[0].outputs[0].token_ids) == expected[16:24]
    reused = llm.engine.stats().num_prefix_hit_tokens - before
    assert reused > len(prompt) // 16 * 16, "the answer's full block came from the cache"
    assert_drafts_kept(llm)
    assert_engine_empty(llm)


def test_greedy_samples_with_drafts_equal_transformers(
    model_dir: Path, prompts: list[list[int]], hf_greedy: list[list[int]], max_new_tokens: int
) -> None:
    """n > 1: the forks share the prompt's blocks and each drafts and rolls back on its own."""
    llm = LLM(model_dir, num_kv_blocks=128, **SPEC)
    params = SamplingParams(n=3, max_tokens=max_new_tokens, temperature=0)
    (output,) = llm.generate(prompts[5], params)
    assert [list(sample.token_ids) for sample in output.outputs] == [hf_greedy[5]] * 3
    assert_drafts_kept(llm)
    assert_engine_empty(llm)


def test_seeded_sampling_draws_the_same_tokens_with_and_without_drafts(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    """One noise draw per emitted token, in order (core/spec/verify.py): the seed's sequence."""
    chosen = prompts[4:]
    params = [
        SamplingParams(max_tokens=24, temperature=0.7, top_p=0.95, seed=seed, n=2)
        for seed in range(len(chosen))
    ]
    plain = LLM(model_dir, num_kv_blocks=256).generate(chosen, params)
    llm = LLM(model_dir, num_kv_blocks=256, **SPEC)
    drafted = llm.generate(chosen, params)
    for without, with_drafts in zip(plain, drafted, strict=True):
        assert [s.token_ids for s in with_drafts.outputs] == [s.token_ids for s in without.outputs]
    assert_drafts_kept(llm)
    assert_engine_empty(llm)


def test_a_speculating_prefill_worker_completes_a_resumed_prompt(
    model_dir: Path, prompts: list[list[int]]
) -> None:
    """A crash-migrated request (resumed tokens) prefilled by a worker with --speculative: its
    chunked context stops one token short, where a decoding request would draft. A prefill job
    must not: its drafts made the step overshoot the prompt, the transfer never opened, and the
    caller waited until its deadline."""
    hub = LocalTransferHub()
    spec = EngineConfig(num_kv_blocks=64, max_num_batched_tokens=8, **SPEC)
    prefill = PrefillEngine(model_dir, spec, LocalKVSender(hub))
    decode = DecodeEngine(
        model_dir,
        EngineConfig(num_kv_blocks=64),
        lambda cache: LocalKVReceiver(hub, cache, 4),
        DecodeLimits(),
    )
    prompt = prompts[2]  # 16 tokens
    resumed = prompt[:9]  # the prompt's start again: the n-gram proposer has a match to draft
    params = SamplingParams(max_tokens=24, temperature=0)
    destination = decode.reserve("moved", prompt, params, resumed).result(timeout=0)
    outcome = prefill.submit("moved", prompt, params, destination, resumed)
    for _ in range(8):  # 25 tokens in chunks of 8: four steps
        if outcome.done():
            break
        prefill.step()
    assert outcome.result(timeout=0).first_token_id >= 0
    assert prefill.stats().num_drafted_tokens == 0
    assert not prefill.has_unfinished()
    decode.abort("moved")
