"""Speculative decoding's parts without a model: n-gram drafting, the acceptance rule on
synthetic distributions, the back-off, and the scheduler with drafts on fake KV memory (rejected
drafts never leak blocks nor enter the prefix cache)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from pdserve.core.config import EngineConfig
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.request import Request
from pdserve.core.sampler import SeededNoise
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.scheduler import Scheduler
from pdserve.core.spec.ngram import NgramIndex
from pdserve.core.spec.speculator import MAX_PAUSE_STEPS, MIN_PAUSE_STEPS, Backoff, Speculator
from pdserve.core.spec.verify import verify_drafts
from tests.core.sim import Arrival, ScriptedProposer, Simulation, StepRecord
from tests.core.test_scheduler_properties import SETTINGS, run_checked, scenarios

# -- n-gram drafting --------------------------------------------------------------------------


def test_ngram_drafts_what_followed_the_longest_suffix() -> None:
    index = NgramIndex()
    # "7 8 9" occurred before, followed by 1 2 3; "8 9" also occurred later, followed by 5.
    context = [7, 8, 9, 1, 2, 3, 4, 8, 9, 5, 0, 7, 8, 9]
    assert index.propose(context, 3) == [1, 2, 3]


def test_ngram_prefers_the_latest_occurrence_and_caps_the_draft() -> None:
    index = NgramIndex()
    context = [1, 2, 10, 11, 1, 2, 20, 1, 2]
    assert index.propose(context, 5) == [20, 1, 2]  # continuation up to the context's end
    assert index.propose(context, 1) == [20]


def test_ngram_without_a_repeat_drafts_nothing() -> None:
    index = NgramIndex()
    assert index.propose([1, 2, 3, 4, 5], 4) == []
    assert index.propose([5], 4) == []
    assert index.propose([3, 3], 4) == []  # a single-token match is not enough


def test_ngram_index_grows_with_the_context() -> None:
    """Indexed incrementally, it answers as a fresh index over the whole context would."""
    grown = NgramIndex()
    context = [4, 5, 6, 4, 5]
    assert grown.propose(context, 2) == [6, 4]
    context += [9, 4, 5]
    assert grown.propose(context, 2) == NgramIndex().propose(context, 2) == [9, 4]


# -- the acceptance rule ----------------------------------------------------------------------

DRAWS = 20_000
# Binomial standard error at DRAWS is at most 0.0035: 5 of them, a test that fails by chance
# about once in 3.5 million runs per probability checked.
TOLERANCE = 5 * math.sqrt(0.25 / DRAWS)


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log()


@pytest.mark.parametrize("draft", [0, 2, 3], ids=["likely", "unlikely", "impossible"])
def test_accepted_tokens_follow_the_target_distribution(draft: int) -> None:
    """Point-mass drafts: the first emitted token is distributed as the target, the draft is
    kept with probability p(draft), and after a kept draft the next token follows the next
    position's distribution."""
    first = [0.5, 0.3, 0.2, 0.0]
    second = [0.1, 0.1, 0.1, 0.7]
    logits = torch.stack([_logits(first), _logits(second), _logits(first)])
    params = SamplingParams(temperature=1.0)
    noise = SeededNoise(0)
    firsts = torch.zeros(4)
    seconds = torch.zeros(4)
    for _ in range(DRAWS):
        emitted = verify_drafts(logits, [draft, 1], params, noise)
        firsts[emitted[0]] += 1
        if emitted[0] == draft:
            seconds[emitted[1]] += 1
    assert torch.allclose(firsts / DRAWS, torch.tensor(first), atol=TOLERANCE)
    if first[draft] > 0:
        assert torch.allclose(seconds / seconds.sum(), torch.tensor(second), atol=TOLERANCE * 2)


def test_top_p_filtered_target_never_keeps_a_filtered_draft() -> None:
    logits = torch.stack([_logits([0.6, 0.35, 0.05]), _logits([0.2, 0.3, 0.5])])
    params = SamplingParams(temperature=1.0, top_p=0.9)  # token 2 is outside the top 0.9
    noise = SeededNoise(1)
    for _ in range(500):
        assert verify_drafts(logits, [2], params, noise)[0] != 2


def test_greedy_keeps_drafts_up_to_the_first_disagreement() -> None:
    logits = torch.eye(5)  # position i's argmax is i
    greedy = SamplingParams(temperature=0)
    assert verify_drafts(logits, [0, 1, 2, 3], greedy, None) == [0, 1, 2, 3, 4]
    assert verify_drafts(logits, [0, 1, 4, 3], greedy, None) == [0, 1, 2]
    assert verify_drafts(logits[:1], [], greedy, None) == [0]


def test_seeded_verification_draws_what_plain_sampling_draws() -> None:
    """Same seed, same tokens with and without drafts: one noise draw per emitted token."""
    from pdserve.core.sampler import sample

    torch.manual_seed(3)
    logits = torch.randn(4, 50)
    params = SamplingParams(temperature=0.8, top_k=20, seed=9)
    plain_noise = SeededNoise(9)
    plain = [sample(logits[i : i + 1], [params], [plain_noise])[0] for i in range(3)]
    spec_noise = SeededNoise(9)
    kept = verify_drafts(logits, [*plain[:2], -1], params, spec_noise)
    assert kept == plain
    assert spec_noise.index == plain_noise.index == 3  # both stand at the same token


# -- back-off ------------------------------------------------------------------------------


def test_backoff_pauses_longer_while_drafts_keep_failing() -> None:
    backoff = Backoff()
    pauses = []
    for _ in range(12):
        steps = 0
        while not backoff.allows_drafts():
            steps += 1
        pauses.append(steps)
        backoff.record(num_drafted=4, num_accepted=0)
    assert pauses[:2] == [0, 0]  # a fresh request drafts, one bad step is forgiven
    assert pauses[2] == MIN_PAUSE_STEPS
    assert pauses[3] == 2 * MIN_PAUSE_STEPS
    assert pauses[-1] == MAX_PAUSE_STEPS


def test_backoff_resumes_after_a_good_step() -> None:
    backoff = Backoff()
    backoff.record(4, 0)
    backoff.record(4, 0)
    while not backoff.allows_drafts():
        pass
    backoff.record(4, 4)
    assert backoff.allows_drafts() and backoff.next_pause == MIN_PAUSE_STEPS


def test_speculator_drafts_only_for_decodes_within_max_tokens() -> None:
    speculator = Speculator(ScriptedProposer(seed=0), num_speculative_tokens=4)
    scheduler = Scheduler(EngineConfig(num_kv_blocks=8, block_size=4))
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=3), 0, 0.0)
    scheduler.add(request)
    speculator.propose([request])
    assert request.draft_token_ids == []  # waiting, nothing computed
    scheduler.schedule()
    scheduler.record_computed(request, 2)
    speculator.propose([request])
    assert request.draft_token_ids == []  # its last prompt token to go: no output to extend
    scheduler.record_computed(request, 1)
    request.output_token_ids.append(0)  # caught up: its next step is a decode
    speculator.propose([request])
    assert len(request.draft_token_ids) == 1  # max_tokens 3: one draft + the target's token


# -- the scheduler with drafts, on fake KV memory ---------------------------------------------


class RolledBackSimulation(Simulation):
    def step(self) -> StepRecord:
        """After a step no running request holds a block past its computed tokens: the blocks
        only rejected drafts used went back at once."""
        record = super().step()
        for request in self.scheduler.running:
            needed = blocks_for(request.num_computed_tokens, self.config.block_size)
            assert len(request.block_ids) == needed, f"{request.request_id} kept draft blocks"
        return record


@SETTINGS
@given(scenarios(), st.integers(1, 5), st.integers(0, 2**16))
def test_rejected_drafts_never_leak_blocks_nor_reach_the_prefix_cache(
    scenario: tuple[EngineConfig, list[Arrival]], num_speculative_tokens: int, seed: int
) -> None:
    """Every invariant of the scheduler's property test holds with drafts: blocks are owned
    exactly (none leaked after a rollback), and every read of KV, through the request's own
    table or a cached prefix, finds verified tokens' KV only."""
    config, arrivals = scenario
    speculator = Speculator(ScriptedProposer(seed), num_speculative_tokens)
    sim = RolledBackSimulation(config, arrivals, Scheduler, speculator)
    run_checked(sim)
    if speculator.num_drafted_tokens:
        event("drafted")
    if speculator.num_accepted_tokens < speculator.num_drafted_tokens:
        event("rejected")
