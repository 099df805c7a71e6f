"""SLO-aware step budgets: the limit each step grants, and the scheduler keeping to it."""

from __future__ import annotations

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.request import Request
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.engine_load import load_of
from pdserve.core.sched.scheduler import Scheduler
from pdserve.costmodel.output_length import MIN_FINISHED, OutputLengths
from pdserve.costmodel.profile import BlockCosts, CostModel, Profile
from pdserve.costmodel.step_budget import MIN_CHUNK_TOKENS, ItlMode, StepCosts, WorkerStepBudget
from pdserve.costmodel.step_shape import StepShape

# 50 ms a step, 1 ms a prompt token, 5 ms a decoding stream.
PROFILE = Profile(
    CostModel((0.05, 0.001, 0.0, 0.005, 0.0)), BlockCosts(1, 0.0, 0.0, 0.0, 1e30), block_size=16
)


def test_a_step_without_decodes_is_bounded_by_the_token_budget_only() -> None:
    limit = StepCosts(PROFILE, 2048, itl_slo_s=0.1).for_step(StepShape())
    assert limit.grant(0, 1000) == 1000


def test_without_an_slo_the_limit_grants_what_is_wanted() -> None:
    limit = StepCosts(PROFILE, 2048).for_step(StepShape.decodes(10, 1000))
    assert limit.grant(0, 1000) == 1000


def test_chunks_fill_the_step_up_to_the_slo() -> None:
    """10 decodes: 0.1 s; a 0.2 s SLO leaves 0.1 s = 100 prompt tokens, shared by the chunks."""
    limit = StepCosts(PROFILE, 2048, itl_slo_s=0.2).for_step(StepShape.decodes(10, 1000))
    assert limit.grant(0, 30) == 30
    assert limit.grant(0, 1000) == 70
    assert limit.grant(0, 1000) == 0


def test_a_full_step_still_makes_progress_on_one_prompt() -> None:
    limit = StepCosts(PROFILE, 2048, itl_slo_s=0.05).for_step(StepShape.decodes(10, 1000))
    assert limit.grant(0, 1000) == MIN_CHUNK_TOKENS
    assert limit.grant(0, 1000) == 0


def test_prefill_steps_predict_the_chunking() -> None:
    costs = StepCosts(PROFILE, 2048, itl_slo_s=0.2)
    steps = list(costs.prefill_steps(StepShape.decodes(10, 1000), (120,)))
    assert [tokens for _, tokens in steps] == [100, 20]
    assert [costs.seconds(shape) for shape, _ in steps] == pytest.approx([0.2, 0.12])


def test_prefill_steps_share_a_step_between_prompts_as_the_scheduler_does() -> None:
    """Two queued prompts of 300 tokens and one of 100 fit one step's 2,048 tokens: one step of
    700 (0.75 s), not three of their own (0.85 s). Past the budget the step ends inside a
    prompt, and under an SLO the limit ends it: the next step goes on where it stopped."""
    costs = StepCosts(PROFILE, 2048)
    steps = list(costs.prefill_steps(StepShape(), (300, 300, 100)))
    assert [(shape.prefill_tokens, tokens) for shape, tokens in steps] == [(700, 700)]
    assert costs.seconds(steps[0][0]) == pytest.approx(0.75)
    budgeted = StepCosts(PROFILE, 500).prefill_steps(StepShape(), (300, 300, 100))
    assert [tokens for _, tokens in budgeted] == [500, 200]
    capped = StepCosts(PROFILE, 2048, itl_slo_s=0.2).prefill_steps(
        StepShape.decodes(10, 1000), (60, 60, 60)
    )
    assert [tokens for _, tokens in capped] == [100, 80]


def test_an_slo_must_be_positive() -> None:
    with pytest.raises(ValueError, match="--itl-slo"):
        StepCosts(PROFILE, 2048, itl_slo_s=0.0)


def _request(request_id: str, prompt_tokens: int, order: int, max_tokens: int = 100) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(request_id, list(range(prompt_tokens)), params, order, 0.0)


def test_the_scheduler_caps_a_prompt_chunk_beside_decodes() -> None:
    """Two streams decode (0.06 s); under a 0.1 s SLO the waiting prompt gets 40 tokens a step,
    and the streams keep decoding every step."""
    scheduler = Scheduler(EngineConfig(num_kv_blocks=64, max_num_batched_tokens=512))
    scheduler.step_budget = WorkerStepBudget(StepCosts(PROFILE, 512, itl_slo_s=0.1))
    streams = [_request(str(i), 8, i) for i in range(2)]
    for request in streams:
        scheduler.add(request)
    first = scheduler.schedule()  # both prompts in one step (no decodes yet: no cap)
    for request in streams:
        scheduler.record_computed(request, first.num_scheduled_tokens[request.request_id])
        request.output_token_ids.append(1)
    scheduler.add(_request("long", 200, 2))
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"0": 1, "1": 1, "long": 40}


# --- --itl-slo-mode mean: each stream's mean gap, not each step ---


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _decoding(request_id: str, tokens: int, max_tokens: int) -> Request:
    """A stream with `tokens` outputs of `max_tokens` (the tests below that check banked slack
    only end the stream at the step they check: no later tokens to lend)."""
    request = _request(request_id, 8, 0, max_tokens)
    request.output_token_ids = [1] * tokens
    return request


def _mean_budget(clock: _Clock, slo_s: float = 0.1) -> WorkerStepBudget:
    return WorkerStepBudget(StepCosts(PROFILE, 2048, slo_s, ItlMode.MEAN), clock)


def test_a_streams_first_decode_gets_the_slo_as_in_step_mode() -> None:
    """2 decodes: 0.06 s; 0.1 s leaves 40 prompt tokens either way."""
    clock = _Clock()
    streams = [_decoding("a", 1, 2), _decoding("b", 1, 2)]
    mean = _mean_budget(clock).for_step(streams).grant(0, 1000)
    step = WorkerStepBudget(StepCosts(PROFILE, 2048, 0.1)).for_step(streams).grant(0, 1000)
    assert mean == step == 40


def test_a_stream_lends_the_slack_of_its_remaining_tokens() -> None:
    """Two streams at their first decode with 9 tokens after this one: each will come 0.04 s
    inside the 0.1 s SLO at the decodes' 0.06 s, so this step may take 0.1 + 9 * 0.04 = 0.46 s
    (0.4 s of prompt); the stream with fewer tokens left sets the cap."""
    clock = _Clock()
    streams = [_decoding("a", 1, 11), _decoding("b", 1, 20)]
    budget = _mean_budget(clock)
    assert budget.for_step(streams).grant(0, 1000) in (399, 400)  # 0.46 s, rounded
    assert budget.last_cap_s == pytest.approx(0.46)  # what the worker's Load reports


def test_a_scheduler_with_a_budget_reports_its_last_steps_cap() -> None:
    scheduler = Scheduler(EngineConfig(num_kv_blocks=64, max_num_batched_tokens=512))
    assert load_of(scheduler).step_cap_s == 0.0  # no budget, no cap
    scheduler.step_budget = WorkerStepBudget(StepCosts(PROFILE, 512, itl_slo_s=0.1))
    scheduler.add(_request("a", 8, 0))
    scheduler.schedule()
    assert load_of(scheduler).step_cap_s == 0.1


def test_streams_ahead_of_the_slo_lend_their_slack_to_a_prompt() -> None:
    """4 gaps in 0.24 s under a 0.1 s SLO: the fifth token may come 0.26 s after the fourth,
    so the step may take 0.26 s (0.2 s of prompt beside the 0.06 s of decodes)."""
    clock = _Clock()
    budget = _mean_budget(clock)
    streams = [_decoding("a", 1, 6), _decoding("b", 1, 6)]
    budget.for_step(streams)
    for _ in range(4):
        clock.now += 0.06
        for stream in streams:
            stream.output_token_ids.append(1)
    assert budget.for_step(streams).grant(0, 1000) in (199, 200)  # 0.26 s, rounded


def test_the_stream_furthest_behind_sets_the_cap() -> None:
    """ "a" is 0.04 s ahead after 2 gaps; "b" joined one gap ago and used 0.06 of its 0.1 s:
    the step may take 0.04 + 0.1 (b's bound), so prompt tokens fill 0.08 s."""
    clock = _Clock()
    budget = _mean_budget(clock)
    a = _decoding("a", 1, 4)
    budget.for_step([a])
    clock.now += 0.08
    a.output_token_ids.append(1)
    b = _decoding("b", 1, 3)
    budget.for_step([a, b])
    clock.now += 0.08
    for stream in (a, b):
        stream.output_token_ids.append(1)
    # a: 0.1 * 3 - 0.16 = 0.14; b: 0.1 * 2 - 0.08 = 0.12; decodes 0.06 s
    assert budget.for_step([a, b]).grant(0, 1000) == 60


def test_a_stream_behind_the_slo_still_gets_the_step_cap() -> None:
    """One gap five times the SLO: the stream cannot catch up by starving prompts, so the cap
    stays the SLO (0.1 s, 0.055 s of it the decode)."""
    clock = _Clock()
    budget = _mean_budget(clock)
    streams = [_decoding("a", 1, 3)]
    budget.for_step(streams)
    clock.now += 0.5
    streams[0].output_token_ids.append(1)
    assert budget.for_step(streams).grant(0, 1000) == 45


def test_a_stream_that_left_the_batch_starts_afresh() -> None:
    clock = _Clock()
    budget = _mean_budget(clock)
    stream = _decoding("a", 1, 3)
    budget.for_step([stream])
    clock.now += 0.5
    budget.for_step([])  # preempted: out of the step
    stream.output_token_ids.append(1)
    assert budget.for_step([stream]).grant(0, 1000) == 45  # 0.1 s again, 0.055 s of decode


def test_a_large_limit_lends_only_the_slack_of_the_tokens_forecast() -> None:
    """A chat stream asking for up to 4,096 tokens where such streams end after 10: it lends 8
    later gaps (10 - 1 generated - this one), not 4,094. Two decodes at 0.06 s under 0.1 s: the
    step may take 0.1 + 8 * 0.04 = 0.42 s, 0.36 s of it prompt tokens."""
    clock = _Clock()
    lengths = OutputLengths()
    for _ in range(MIN_FINISHED):
        lengths.record(4096, 10)
    costs = StepCosts(PROFILE, 2048, 0.1, ItlMode.MEAN)
    streams = [_decoding("a", 1, 4096), _decoding("b", 1, 4096)]
    unlimited = WorkerStepBudget(costs, clock).for_step(streams).grant(0, 2048)
    forecast = WorkerStepBudget(costs, clock, lengths=lengths).for_step(streams).grant(0, 2048)
    assert unlimited == 2048  # the limit's slack: the whole token budget
    assert forecast in (359, 360)


def _landed(request_id: str, prompt_tokens: int, order: int, scheduler: Scheduler) -> Request:
    """A request whose prompt KV arrived from the prefill tier, with prefill's first token: it
    joins the waiting queue one token behind, as decode_service/engine.py admits it. Its tokens
    are no other prompt's prefix (no cached blocks shared)."""
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    request = Request(request_id, list(range(1000, 1000 + prompt_tokens)), params, order, 0.0)
    assert scheduler.kv_manager.allocate_prompt(request)
    scheduler.record_computed(request, request.num_tokens - request.num_computed_tokens)
    request.output_token_ids.append(1)
    scheduler.add(request)
    return request


def test_a_stream_whose_kv_landed_joins_beside_a_prompt_chunking_alone() -> None:
    """A 200-token prompt chunks alone in 64-token steps; a stream whose KV lands meanwhile
    decodes at the next step (the chunk leaves it a token), not after the whole prompt."""
    scheduler = Scheduler(EngineConfig(num_kv_blocks=64, max_num_batched_tokens=64))
    long = _request("long", 200, 0)
    scheduler.add(long)
    first = scheduler.schedule()
    assert first.num_scheduled_tokens == {"long": 64}
    scheduler.record_computed(long, 64)
    _landed("chat", 20, 1, scheduler)
    assert scheduler.schedule().num_scheduled_tokens == {"long": 63, "chat": 1}


def test_a_landed_stream_counts_as_a_decode_under_the_itl_slo() -> None:
    """Under a 0.1 s SLO a prompt alone takes the whole token budget; with a stream joining
    (0.055 s of the step) the chunk is capped to the 45 tokens the SLO leaves."""
    scheduler = Scheduler(EngineConfig(num_kv_blocks=64, max_num_batched_tokens=512))
    scheduler.step_budget = WorkerStepBudget(StepCosts(PROFILE, 512, itl_slo_s=0.1))
    scheduler.add(_request("long", 200, 0))
    _landed("chat", 20, 1, scheduler)
    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"long": 45, "chat": 1}


def test_a_prompt_chunk_keeps_a_token_when_joining_streams_would_hold_the_whole_budget() -> None:
    """Two streams whose KV landed would hold both tokens of a 2-token budget; the prompt ahead
    of them (it arrived first) still takes one, and one stream the other: neither the better
    request waits while worse ones run nor does the step stall."""
    scheduler = Scheduler(EngineConfig(num_kv_blocks=64, max_num_batched_tokens=2))
    scheduler.add(_request("long", 20, 0))
    _landed("chat-1", 4, 1, scheduler)
    _landed("chat-2", 4, 2, scheduler)
    assert scheduler.schedule().num_scheduled_tokens == {"long": 1, "chat-1": 1}


def test_prefill_steps_spend_a_reported_cap_over_the_slo_step_by_step() -> None:
    """A worker in `mean` mode held its last step to 0.3 s (its streams' slack) under a 0.2 s
    SLO: the first step takes 200 tokens (10 decodes, 0.1 s, leave 0.2 s), which spends 0.2 s
    over a decode-only step, so the next is held to the SLO (100 tokens), and so on."""
    costs = StepCosts(PROFILE, 2048, itl_slo_s=0.2)
    steps = list(costs.prefill_steps(StepShape.decodes(10, 1000), (350,), cap_s=0.3))
    assert [tokens for _, tokens in steps] == [200, 100, 50]
    assert list(costs.prefill_steps(StepShape.decodes(10, 1000), (350,), cap_s=0.1)) == list(
        costs.prefill_steps(StepShape.decodes(10, 1000), (350,))
    )  # never below the SLO
