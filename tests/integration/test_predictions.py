"""Predictions through real processes, on a 1P1D cluster whose router (adaptive placement) and
decode worker are given a profile with every cost doubled (the tests' profile, already from
another host, made 2x more wrong).

Online correction: the decode worker's Load reports its recent steps; the correction they give,
applied to the next burst's steps before those run, predicts them within 15 %; the router and the
worker export the same factor. Admission: under a burst whose requests each ask for a TTFT SLO,
those predicted to miss it are refused at once with a retry delay, the others complete with
transformers' tokens, and no block stays held."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.core.serving.step_window_proto import step_windows_from_proto
from pdserve.costmodel.correction import (
    MIN_STEPS,
    WINDOW_STEPS,
    StepPhase,
    StepWindow,
    correction_from,
    predicted_seconds,
)
from pdserve.costmodel.profile import CostModel, Profile, ServingCosts, load_profile
from pdserve.local.cluster import Cluster, CpuPin
from tests.fakes import PROFILE_OTHER_HOST

from .conftest import start_cluster
from .helpers import labelled_metric, load, wait_all_blocks_free

pytestmark = pytest.mark.integration

STREAMS = 4
# Each burst decodes more steps than a window holds: a burst's window shares no step with the
# one before.
TOKENS = WINDOW_STEPS + 8
# The corrected prediction against what two bursts measured: the 15 %. Unpinned (before
# PINS), two runs measured the same 64 steps' work at 3.57 and 4.98 s and the bound was 25 %;
# pinned, three runs on 2026-12-05 measured 3.465, 3.483 and 3.482 s, predicted within 1 %. The
# uncorrected doubled profile is 3.8x off, so the bound fails without the correction.
WITHIN = 0.15
TTFT_SLO = 1.5  # seconds: a few prompts of the burst fit on this host, not all 24


def doubled(profile: Profile) -> Profile:
    model = CostModel(tuple(2 * c for c in profile.model.coefficients))
    serving = profile.serving
    twice = ServingCosts(2 * serving.per_step_s, 2 * serving.per_token_s, 2 * serving.dispatch_s)
    return dataclasses.replace(profile, model=model, serving=twice)


@pytest.fixture(scope="module")
def wrong_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "doubled.json"
    doubled(load_profile(PROFILE_OTHER_HOST)).save(path)
    return path


# Each worker on a core of its own with one torch thread, as `bench disagg` runs them: unpinned,
# the decode worker's two matmul threads shared both cores with the prefill worker, the router
# and this test's client, and the same burst's steps took 3.57 s in one run and 4.98 s in another.
PINS = (CpuPin("prefill", 0, (0,)), CpuPin("decode", 0, (1,)))


def _cluster(
    model_dir: Path, logs: Path, profile: Path, placement: str, pins: tuple[CpuPin, ...] = ()
) -> Iterator[Cluster]:
    flags = ("--profile", str(profile))
    router = (*flags, "--placement", placement)
    running = start_cluster(model_dir, logs, 1, 1, router_args=router, decode_args=flags, pins=pins)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def cluster(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory, wrong_profile: Path
) -> Iterator[Cluster]:
    """Threshold placement: every burst runs the same way (prefill remote, 4 streams decoding on
    the decode worker), so the windows hold the same work."""
    logs = tmp_path_factory.mktemp("correction-logs")
    yield from _cluster(model_dir, logs, wrong_profile, "threshold", PINS)


@pytest.fixture(scope="module")
def adaptive_cluster(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory, wrong_profile: Path
) -> Iterator[Cluster]:
    """Adaptive placement: it counts each prompt on its worker as it places it, so within a
    burst admission sees the load of the requests admitted before."""
    logs = tmp_path_factory.mktemp("admission-logs")
    yield from _cluster(model_dir, logs, wrong_profile, "adaptive")


def _burst(cluster: Cluster, prompts: list[list[int]]) -> None:
    sampling = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)

    async def run() -> None:
        async with GenerationClient.connect(cluster.router.address) as client:
            requests = [build_request(prompt, sampling=sampling) for prompt in prompts]
            await asyncio.gather(*(client.generate(request) for request in requests))

    asyncio.run(run())


def _decode_window(cluster: Cluster) -> StepWindow:
    windows = step_windows_from_proto(load(cluster.decode[0]).step_windows)
    (window,) = [w for w in windows if w.phase is StepPhase.DECODE]
    return window


def test_a_doubled_profile_predicts_the_next_steps_within_15_percent(
    cluster: Cluster, wrong_profile: Path, prompts: list[list[int]]
) -> None:
    profile = load_profile(wrong_profile)
    # Warm-up first: a fresh worker's first steps of a shape are slower (allocator, the matmul
    # library's first calls) and would skew the window the correction is taken from.
    _burst(cluster, [prompt[2:62] for prompt in prompts[4:8]])
    _burst(cluster, [prompt[:60] for prompt in prompts[4:8]])  # 60-token prompts
    first = _decode_window(cluster)
    assert first.steps == WINDOW_STEPS >= MIN_STEPS
    correction = correction_from(profile, [first])
    factor = correction.factors[StepPhase.DECODE]

    # Two more bursts of fresh prompts of the same lengths, each window predicted with the
    # factor from before both: 64 steps, so one burst's swing on a shared 2-core host (about
    # +-10 % between bursts of the same work here) counts half.
    checked = []
    for shift in (1, 3):
        _burst(cluster, [prompt[shift : shift + 60] for prompt in prompts[4:8]])
        checked.append(_decode_window(cluster))
    measured = sum(window.seconds for window in checked)
    uncorrected = sum(predicted_seconds(profile, window) for window in checked)
    corrected = uncorrected * factor
    figures = f"{measured:.3f} s measured over {2 * WINDOW_STEPS} decode steps; predicted "
    figures += f"{uncorrected:.3f} s uncorrected, {corrected:.3f} s corrected by {factor:.3f}"
    print(figures)  # `pytest -s` shows it (docs/planning.md quotes a run)
    assert corrected == pytest.approx(measured, rel=WITHIN), figures
    second = checked[-1]
    # The worker's own factor and the router's for it: from the same window as this test's.
    latest = correction_from(profile, [second]).factors[StepPhase.DECODE]
    decode = cluster.decode[0]
    labels = {"phase": "decode"}
    assert labelled_metric(decode, "pdserve_decode_step_correction", **labels) == pytest.approx(
        latest
    )
    router_labels = {"tier": "decode", "worker": decode.address, **labels}
    deadline = time.monotonic() + 5.0  # the router's next Load poll (every 0.5 s) brings it
    while True:
        seen = labelled_metric(cluster.router, "pdserve_router_step_correction", **router_labels)
        if seen == pytest.approx(latest) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert seen == pytest.approx(latest)
    wait_all_blocks_free(cluster)


def test_a_burst_past_its_ttft_slo_is_refused_at_once_and_the_rest_is_served(
    adaptive_cluster: Cluster,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    """Three rounds of every prompt (1-500 tokens) at once, each asking for its first token
    within TTFT_SLO: the first ones find idle workers, the later ones the queue the earlier ones
    made; the doubled profile's predictions are corrected by the steps as they run."""
    work = [index for _ in range(3) for index in range(len(prompts))]
    sampling = SamplingParams(max_tokens=max_new_tokens, temperature=0.0)

    async def one(index: int) -> tuple[int, list[int] | grpc.aio.AioRpcError]:
        request = build_request(prompts[index], sampling=sampling)
        request.slo.ttft_seconds = TTFT_SLO
        async with GenerationClient.connect(adaptive_cluster.router.address) as client:
            try:
                return index, list((await client.generate(request)).token_ids)
            except grpc.aio.AioRpcError as error:
                return index, error

    async def burst() -> list[tuple[int, list[int] | grpc.aio.AioRpcError]]:
        return await asyncio.gather(*(one(index) for index in work))

    outcomes = asyncio.run(burst())
    served = [(i, tokens) for i, tokens in outcomes if isinstance(tokens, list)]
    refused = [error for _, error in outcomes if isinstance(error, grpc.aio.AioRpcError)]
    assert served and refused, f"{len(served)} served, {len(refused)} refused"
    for index, tokens in served:
        assert tokens == hf_greedy[index]
    for error in refused:
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error
        assert "predicted TTFT" in (error.details() or "")
        pushback = dict(error.trailing_metadata() or ())["grpc-retry-pushback-ms"]
        assert int(pushback) >= 1000
    wait_all_blocks_free(adaptive_cluster)
