"""`pdserve plan --placements`: which router placements the search tries, and what the plan's
values tell the router."""

from __future__ import annotations

import pytest

from pdserve.core.config import EngineConfig
from pdserve.planner.helm_values import helm_values
from pdserve.planner.plan import SearchSpace, Slo, deployments, evaluate
from pdserve.planner.plan_cli import placement_modes
from pdserve.planner.workload import TraceRequest
from pdserve.router.placement.prefill_place import PlacementMode
from tests.planner.helpers import fixed_step_profile

REQUESTS = [TraceRequest(0.1 * i, 20 + 10 * i, 4) for i in range(8)]
ONE_ENGINE = SearchSpace(max_num_seqs=(16,), chunk_budgets=(256,))


def _modes(space: SearchSpace) -> list[tuple[int, PlacementMode]]:
    found = deployments(2, EngineConfig(), space, REQUESTS)
    return sorted({(d.num_prefill, d.placement.mode) for d in found}, key=str)


def test_the_default_search_tries_the_threshold_rule_only() -> None:
    assert {mode for _, mode in _modes(ONE_ENGINE)} == {PlacementMode.THRESHOLD}


def test_adaptive_is_tried_wherever_there_is_a_prefill_tier() -> None:
    both = SearchSpace(
        max_num_seqs=(16,),
        chunk_budgets=(256,),
        placements=(PlacementMode.THRESHOLD, PlacementMode.ADAPTIVE),
    )
    assert (1, PlacementMode.ADAPTIVE) in _modes(both)
    assert (0, PlacementMode.ADAPTIVE) not in _modes(both)  # colocated: nothing to choose


def test_an_adaptive_plan_tells_the_router_its_placement_and_the_workers_budget() -> None:
    adaptive = SearchSpace(
        max_num_seqs=(16,), chunk_budgets=(256,), placements=(PlacementMode.ADAPTIVE,)
    )
    split = next(d for d in deployments(2, EngineConfig(), adaptive, REQUESTS) if d.num_prefill)
    assert split.name == "1P1D A"
    candidate = evaluate(split, fixed_step_profile(0.01), REQUESTS, Slo(10.0, 10.0))
    assert candidate.completed_fraction == 1.0
    router = helm_values(candidate, rate=1.0, peak_rate=2.0)["router"]
    assert router["placement"] == "adaptive"
    assert router["maxNumBatchedTokens"] == 256


def test_an_unknown_placement_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--placements"):
        placement_modes("threshold,magic")
