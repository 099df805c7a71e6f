"""The planner's a-priori pieces without a cluster: serving costs fitted from real-looking runs,
the engine flags a real run is started with, validation traces, plan verification's verdicts."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from pdserve.core.config import EngineConfig
from pdserve.core.serving.cli_config import add_engine_arguments, engine_config_from_args
from pdserve.costmodel.profile import ServingCosts, load_profile
from pdserve.planner.fidelity import RequestSlo, a_priori_deployment, figures, simulate_seen
from pdserve.planner.plan import Slo
from pdserve.planner.real_runs import Seen, engine_flags
from pdserve.planner.serving_calibration import BURSTS, burst, fit_serving
from pdserve.planner.sim_cluster import Deployment
from pdserve.planner.validate_cli import repeat_noise, summary, validation_trace
from pdserve.planner.verify import report
from pdserve.planner.workload import PoissonSpec, TokenRange, TraceRequest
from pdserve.router.placement.prefill_place import PlacementConfig
from tests.planner.helpers import fixed_step_profile


def test_serving_costs_are_recovered_from_runs_that_paid_them() -> None:
    engine = EngineConfig()
    offline = fixed_step_profile(0.02)
    paid = ServingCosts(per_step_s=0.004, per_token_s=0.001)
    deployment = a_priori_deployment(1, 1, engine, PlacementConfig())
    real = {
        size: simulate_seen(deployment, dataclasses.replace(offline, serving=paid), burst(size))
        for size in BURSTS
    }
    fitted = fit_serving(offline, engine, real)
    assert fitted.per_step_s == pytest.approx(0.004, abs=1e-6)
    assert fitted.per_token_s == pytest.approx(0.001, abs=1e-7)
    assert fitted.dispatch_s == pytest.approx(0.0, abs=1e-9)
    assert fitted.calibration["bursts"] == list(BURSTS)


def test_serving_costs_survive_a_save(tmp_path: Path) -> None:
    costs = ServingCosts(0.001, 0.002, 0.003, {"bursts": [1, 2]})
    profile = dataclasses.replace(fixed_step_profile(0.01), serving=costs)
    profile.save(tmp_path / "profile.json")
    assert load_profile(tmp_path / "profile.json").serving == costs


def test_engine_flags_give_the_workers_the_same_engine() -> None:
    engine = EngineConfig(num_kv_blocks=256, max_num_seqs=8, enable_prefix_caching=False)
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args(list(engine_flags(engine)))) == engine
    assert engine_flags(EngineConfig()) == ()


def test_validation_traces_are_at_the_rate_and_fresh_each_repeat() -> None:
    spec = PoissonSpec(2.0, 60.0, TokenRange(10, 500), TokenRange(10, 40), seed=3)
    first = validation_trace(spec, 2.0, 10.0, repeat=0)
    second = validation_trace(spec, 2.0, 10.0, repeat=1)
    assert [r.arrival_s for r in first] == [(i + 1) / 2.0 for i in range(20)]  # as ghz paces
    assert [r.prompt_tokens for r in first] != [r.prompt_tokens for r in second]


def _seen(ttft: float, gap: float, tokens: int = 3, ok: bool = True) -> Seen:
    return Seen(ttft, (gap,) * (tokens - 1), tokens, ok)


def test_attainment_counts_requests_within_both_slos() -> None:
    seen = [_seen(0.5, 0.05), _seen(2.0, 0.05), _seen(0.5, 0.5), _seen(0.5, 0.05, ok=False)]
    assert figures(seen, RequestSlo(ttft_s=1.0, tpot_s=0.1))["attainment"] == 0.25


def test_verification_reports_both_verdicts() -> None:
    slo = Slo(ttft_p90_s=1.0, itl_p99_s=0.1)
    predicted = [_seen(0.5, 0.05)] * 10
    real = [_seen(0.5, 0.05)] * 8 + [_seen(3.0, 0.05)] * 2
    result = report("1P1D", 0.5, slo, predicted, real)
    assert result["plan"] == "1P1D"
    assert (result["predicted_attainment"], result["real_attainment"]) == (1.0, 0.8)
    assert (result["meets_slo_predicted"], result["meets_slo_real"]) == (True, False)


def test_the_noise_floor_is_each_repeat_against_the_others() -> None:
    assert repeat_noise([1.0], relative=True) is None
    # 1.0 against 2.0: 100 %; 2.0 against 1.0: 50 %.
    assert repeat_noise([1.0, 2.0], relative=True) == pytest.approx(0.75)
    assert repeat_noise([0.5, 0.9], relative=False) == pytest.approx(0.4)


def test_an_error_within_the_runs_own_noise_meets_the_target() -> None:
    def line(error: float, noise: float | None) -> dict[str, object]:
        return {"metric": "ttft_p50", "error": error, "noise": noise}

    noisy = summary([line(0.2, 0.3), line(0.2, 0.3)])
    assert noisy["meets_target"] and noisy["median_noise"] == pytest.approx(0.3)
    quiet = summary([line(0.2, 0.02), line(0.2, 0.02)])
    assert not quiet["meets_target"]
    assert summary([line(0.05, None)])["meets_target"]  # one repeat: the fixed targets


def test_workers_pinned_to_one_core_share_it_only_while_both_step() -> None:
    """2P1D as the validation pins it: a prompt alone on the prefill core has it all (as on
    1P1D's), two at once divide it; an even split priced the lone one at half speed."""
    profile = fixed_step_profile(0.1)
    engine = EngineConfig()
    shared = a_priori_deployment(2, 1, engine, PlacementConfig())
    halves = dataclasses.replace(shared, one_core_per_tier=False, prefill_share=0.5)
    alone = [TraceRequest(0.0, 16, 2)]

    def ttfts(deployment: Deployment, trace: list[TraceRequest]) -> list[float]:
        return [seen.ttft_s or 0.0 for seen in simulate_seen(deployment, profile, trace)]

    one_core = ttfts(a_priori_deployment(1, 1, engine, PlacementConfig()), alone)
    assert ttfts(shared, alone) == pytest.approx(one_core)
    assert ttfts(halves, alone)[0] > one_core[0] + 0.09  # its prefill step at half speed
    together = ttfts(shared, [TraceRequest(0.0, 16, 2), TraceRequest(0.0, 16, 2)])
    assert max(together) > one_core[0] + 0.09  # the core divided while both step
