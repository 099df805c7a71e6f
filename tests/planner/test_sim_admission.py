"""The simulator runs the router's SLO admission (router/slo_admission.py `predict` and `judge`,
the same functions) on its workers' exact loads; the plan sizes with it. On synthetic queues with
fixed steps the predictions can be checked against the simulated times themselves."""

from __future__ import annotations

import pytest

from pdserve.core.config import EngineConfig
from pdserve.planner.plan import SearchSpace, Slo, search
from pdserve.planner.sim_cluster import ClusterSim, Deployment
from pdserve.planner.sim_report import summarize
from pdserve.planner.workload import TraceRequest
from pdserve.router.slo_admission import Slo as RequestSlo
from tests.planner.helpers import fixed_step_profile

STEP = 0.05
# One 40-token prompt a step: a burst queues, the k-th prompt's first token comes at k steps.
ONE_PROMPT_A_STEP = EngineConfig(max_num_batched_tokens=40, max_num_seqs=64)


def burst(count: int) -> list[TraceRequest]:
    return [TraceRequest(0.0, 40, 1) for _ in range(count)]


def test_a_burst_past_the_slo_is_refused_and_the_admitted_meet_their_predictions() -> None:
    deployment = Deployment(0, 1, decode_config=ONE_PROMPT_A_STEP, admission=RequestSlo(ttft_s=0.2))
    result = ClusterSim(deployment, fixed_step_profile(STEP)).run(burst(10))
    admitted = [j for j in result.journeys if not j.refused]
    refused = [j for j in result.journeys if j.refused]
    assert len(admitted) == 4  # first tokens at 1-4 steps: 0.05-0.2 s
    for journey in admitted:
        assert journey.predicted_ttft_s is not None
        ttft = journey.token_times[0] - journey.arrival_s
        assert ttft == pytest.approx(journey.predicted_ttft_s)
        assert ttft <= 0.2 + 1e-9
    assert all(j.predicted_ttft_s is not None and j.predicted_ttft_s > 0.2 for j in refused)
    assert all(not j.token_times for j in refused)
    assert summarize(result)["refused"] == 6


def test_without_an_slo_nothing_is_refused_or_predicted() -> None:
    result = ClusterSim(Deployment(0, 1, decode_config=ONE_PROMPT_A_STEP), fixed_step_profile(STEP))
    journeys = result.run(burst(10)).journeys
    assert not any(j.refused for j in journeys)
    assert all(j.predicted_ttft_s is None for j in journeys)


def test_the_plan_sizes_for_goodput_with_admission_on() -> None:
    """Ten prompts at once, TTFT p90 <= 0.2 s: serving all of them needs more workers than
    admission does when it may refuse up to 60 % of them."""
    slo = Slo(ttft_p90_s=0.2, itl_p99_s=1.0)
    space = SearchSpace(max_workers=4, max_num_seqs=(64,), chunk_budgets=(40,))
    serve_all = search(fixed_step_profile(STEP), burst(10), slo, EngineConfig(), space)
    gated = SearchSpace(
        max_workers=4, max_num_seqs=(64,), chunk_budgets=(40,), admission=True, max_refused=0.6
    )
    with_admission = search(fixed_step_profile(STEP), burst(10), slo, EngineConfig(), gated)
    assert serve_all.best is not None and with_admission.best is not None
    assert with_admission.best.workers < serve_all.best.workers
    assert 0 < with_admission.best.refused_fraction <= 0.6
    assert with_admission.best.deployment.admission == RequestSlo(0.2, 1.0)
