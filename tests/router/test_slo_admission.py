"""Admission by predicted SLO miss (router/slo_admission.py) on synthetic loads, priced by a cost
model simple enough to check by hand: a step costs 50 ms, plus 1 ms per prompt token, plus 5 ms
per decoding stream; the router's dispatch adds 20 ms to every request's way in."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import openai
import pytest
from prometheus_client import REGISTRY

from pdserve.client import build_request
from pdserve.core.sampling_params import InvalidRequestError
from pdserve.costmodel.profile import BlockCosts, CostModel, Profile, ServingCosts
from pdserve.costmodel.step_budget import StepCosts
from pdserve.router.errors import RouterError
from pdserve.router.placement.adaptive import WorkerRole, WorkerState
from pdserve.router.slo_admission import NO_SLO, Miss, Slo, SloGate, judge, predict
from pdserve.v1 import common_pb2, generation_pb2

from .test_http import openai_client

SAMPLING = common_pb2.SamplingParams(max_tokens=3)

PROFILE = Profile(
    CostModel((0.05, 0.001, 0.0, 0.005, 0.0)),
    BlockCosts(1, 0.0, 0.0, 0.0, 1e30),
    block_size=16,
    serving=ServingCosts(dispatch_s=0.02),
)
COSTS = StepCosts(PROFILE, 2048)
DECODE = WorkerRole.DECODE


def decode(running: int = 0, pending: int = 0) -> WorkerState:
    return WorkerState("d", DECODE, DECODE, running, running * 100, int(pending > 0), pending)


def test_an_idle_worker_predicts_one_prefill_step_and_the_dispatch() -> None:
    prediction = predict(100, 10, [decode()], COSTS)
    assert prediction.ttft_s == pytest.approx(0.02 + 0.05 + 0.1)
    assert prediction.tpot_s == pytest.approx(0.05 + 0.005)


def test_the_queue_ahead_is_in_the_ttft_and_the_excess_is_the_retry_delay() -> None:
    """2,000 prompt tokens queued (one 2,048-token step: 2.05 s) before this prompt's 0.15 s,
    plus 0.02 s of dispatch: 2.22 s against a 1 s SLO: retry in 2 s (1.22 s, rounded up)."""
    prediction = predict(100, 10, [decode(pending=2000)], COSTS)
    assert prediction.ttft_s == pytest.approx(2.22)
    refusal = judge(prediction, Slo(ttft_s=1.0))
    assert refusal is not None and refusal.miss is Miss.TTFT and refusal.retry_after_s == 2
    assert "TTFT 2.220 s misses the SLO 1.000 s" in refusal.message()
    assert judge(prediction, Slo(ttft_s=3.0)) is None


def test_too_many_streams_miss_the_tpot() -> None:
    """30 streams decoding: a step with one more takes 0.05 + 31 x 0.005 = 0.205 s."""
    prediction = predict(10, 10, [decode(running=30)], COSTS)
    refusal = judge(prediction, Slo(tpot_s=0.15))
    assert refusal is not None and refusal.miss is Miss.TPOT and refusal.retry_after_s == 1
    assert judge(prediction, Slo(tpot_s=0.25)) is None


def test_a_prefill_that_would_slow_the_running_streams_past_the_tpot_is_refused() -> None:
    """4 streams decode on the only worker: a 1,000-token prompt prefilled beside them makes
    their step about 0.05 + 1.0 s, past a 0.5 s TPOT SLO, though its own TPOT would hold. A
    100-token prompt (a ~0.17 s step) is admitted, and so is the long one on an idle worker."""
    long_prompt = predict(1000, 10, [decode(running=4)], COSTS)
    assert long_prompt.tpot_s < 0.5 < 1.0 < long_prompt.running_step_s < 1.2
    refusal = judge(long_prompt, Slo(tpot_s=0.5))
    assert refusal is not None and refusal.miss is Miss.RUNNING_TPOT
    assert refusal.retry_after_s == 1
    assert "slow the streams running on its worker" in refusal.message()
    assert judge(predict(100, 10, [decode(running=4)], COSTS), Slo(tpot_s=0.5)) is None
    idle = predict(1000, 10, [decode()], COSTS)
    assert idle.running_step_s == 0.0 and judge(idle, Slo(tpot_s=0.5)) is None
    queued = predict(100, 10, [decode(running=4, pending=2000)], COSTS)
    assert queued.running_step_s < 0.5  # the prompts queued ahead are not this request's doing


def test_a_requests_own_slo_wins_over_the_routers() -> None:
    router = Slo(ttft_s=1.0, tpot_s=0.1)
    own = Slo.from_proto(generation_pb2.RequestSlo(ttft_seconds=5.0))
    assert own.or_else(router) == Slo(ttft_s=5.0, tpot_s=0.1)
    assert NO_SLO.or_else(router) == router and not NO_SLO.any


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_a_bad_slo_is_invalid_naming_the_field(value: float) -> None:
    with pytest.raises(InvalidRequestError, match=r"slo\.tpot_seconds"):
        Slo.from_proto(generation_pb2.RequestSlo(tpot_seconds=value))


def test_the_gate_refuses_with_resource_exhausted_and_a_retry_delay() -> None:
    workers = [decode(pending=2000)]
    gate = SloGate(
        Slo(ttft_s=1.0), COSTS, lambda: workers, lambda limit, done: limit - done, lambda: 0.0
    )
    with pytest.raises(RouterError) as refused:
        gate.check(100, 10, NO_SLO)
    assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.retry_after_s == 2
    admitted = gate.check(100, 10, Slo(ttft_s=10.0))  # its own, looser
    assert admitted is not None and admitted.ttft_s == pytest.approx(2.22)
    assert (
        SloGate(NO_SLO, COSTS, lambda: workers, lambda m, d: m, lambda: 0.0).check(100, 10, NO_SLO)
        is None
    )


def test_an_slo_without_a_cost_model_is_refused_naming_it() -> None:
    gate = SloGate(NO_SLO, None, lambda: [decode()], lambda limit, done: limit, lambda: 0.0)
    with pytest.raises(InvalidRequestError, match="slo: this router predicts no SLOs"):
        gate.check(100, 10, Slo(ttft_s=1.0))


def _refusals(reason: str) -> float:
    labels = {"reason": reason}
    return REGISTRY.get_sample_value("pdserve_router_admission_refusals_total", labels) or 0.0


def test_both_doors_refuse_a_predicted_miss_at_once_with_a_retry_delay(router_stack: Any) -> None:
    """The only worker, a decode one, reports 2,000 prompt tokens queued: 2.22 s to a first token
    against the router's 1 s SLO. gRPC: RESOURCE_EXHAUSTED with grpc-retry-pushback-ms; HTTP:
    429 with Retry-After; nothing reaches a worker. A request with its own 5 s SLO is served."""

    async def body() -> None:
        async with router_stack(0, 1, costs=COSTS, slo_ttft_seconds=1.0) as stack:
            load = stack.tiers.decode[0].knobs.load
            load.num_waiting, load.num_pending_prompt_tokens = 1, 2000
            await stack.registry.poll()
            before = _refusals("ttft")
            request = build_request([1] * 100, sampling=SAMPLING)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stack.client.generate(request)
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "predicted TTFT" in (refused.value.details() or "")
            trailers = dict(refused.value.trailing_metadata() or ())
            assert trailers["grpc-retry-pushback-ms"] == "2000"
            async with openai_client(stack) as (client, model):
                with pytest.raises(openai.APIStatusError) as caught:
                    await client.completions.create(model=model, prompt=[1] * 100, max_tokens=3)
                assert caught.value.status_code == 429
                assert caught.value.response.headers["retry-after"] == "2"
                slo = {"ttft_seconds": 5.0}
                reply = await client.completions.create(
                    model=model, prompt=[1] * 100, max_tokens=3, extra_body={"slo": slo}
                )
                assert reply.choices[0].finish_reason == "length"
            assert _refusals("ttft") == before + 2
            assert (
                len(stack.tiers.decode[0].reserves) + len(stack.tiers.decode[0].local_requests) == 1
            )  # only the admitted request reached a worker

    asyncio.run(body())
