"""The router's public API over fake tiers when things go wrong: retries, cancellation,
deadlines and overload (the plain request flow is in test_servicer.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from pdserve.client import build_request
from pdserve.testing.fake_tiers import FIRST_TOKEN_ID, Failure
from pdserve.v1 import common_pb2


def _count(method: str, code: str) -> float:
    labels = {"method": method, "code": code}
    return REGISTRY.get_sample_value("pdserve_router_requests_total", labels) or 0.0


def sampling(**fields: Any) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(**fields)


def test_prefill_unavailable_aborts_the_reservation_and_retries_elsewhere(
    router_stack: Any,
) -> None:
    async def body() -> None:
        async with router_stack(num_prefill=2) as stack:
            failing, healthy = stack.tiers.prefill
            failing.knobs.failures.append(Failure(grpc.StatusCode.UNAVAILABLE, "worker died"))
            healthy.knobs.load.num_waiting = 1  # so the router tries the failing one first
            await stack.registry.poll()
            request = build_request([1, 2], sampling=sampling(max_tokens=2), request_id="retry")
            reply = await stack.client.generate(request, timeout=10)
            assert list(reply.token_ids) == [FIRST_TOKEN_ID, 1]
            assert (len(failing.calls), len(healthy.calls)) == (1, 1)
            decode = stack.tiers.decode[0]
            assert len(decode.reserves) == 2
            # The first reservation, aborted before the new Reserve; both under the router's id.
            assert decode.aborts == [decode.reserves[0].request.request_id]
            assert decode.reserves[1].request.request_id == decode.aborts[0] != "retry"

    asyncio.run(body())


def test_a_prefill_whose_decode_worker_died_is_retried_on_another_decode_worker(
    router_stack: Any,
) -> None:
    """The only prefill worker fails UNAVAILABLE because the decode worker it was sending KV to
    was killed: the prefill worker is not blamed (it stays healthy) and the hand-off is done
    again on the other decode worker."""

    async def body() -> None:
        async with router_stack(num_prefill=1, num_decode=2) as stack:
            dying, other = stack.tiers.decode
            other.knobs.load.num_waiting = 1  # so the router reserves on the dying one first
            await stack.registry.poll()
            dying.knobs.load_fails = True  # from now on it refuses, as a killed process does
            prefill = stack.tiers.prefill[0]
            lost = "UCXXConnectionResetError('Connection reset by remote peer')"
            prefill.knobs.failures.append(Failure(grpc.StatusCode.UNAVAILABLE, lost))
            request = build_request([1, 2], sampling=sampling(max_tokens=2), request_id="moved")
            reply = await stack.client.generate(request, timeout=10)
            assert list(reply.token_ids) == [FIRST_TOKEN_ID, 1]
            assert (len(dying.reserves), len(other.reserves), len(prefill.calls)) == (1, 1, 2)
            assert stack.registry.prefill.healthy_count() == 1
            assert stack.registry.decode.healthy_count() == 1  # the dying one is out

    asyncio.run(body())


def test_retries_are_bounded_and_the_last_failure_reaches_the_client(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_prefill=1, max_attempts=3) as stack:
            prefill = stack.tiers.prefill[0]
            prefill.knobs.failures.extend(
                Failure(grpc.StatusCode.INTERNAL, f"boom {n}") for n in range(5)
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.client.generate(build_request([1]), timeout=10)
            assert caught.value.code() == grpc.StatusCode.INTERNAL
            assert caught.value.details() == "boom 2"
            assert len(prefill.calls) == 3
            await stack.dispatcher.wait_aborts()
            assert len(stack.tiers.decode[0].aborts) == 3

    asyncio.run(body())


def test_failed_precondition_passes_through_unchanged_without_retry(router_stack: Any) -> None:
    message = "destination.layout: decode KVLayout(16 layers) != prefill KVLayout(30 layers)"

    async def body() -> None:
        async with router_stack(num_prefill=2) as stack:
            for prefill in stack.tiers.prefill:
                prefill.knobs.failures.append(Failure(grpc.StatusCode.FAILED_PRECONDITION, message))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.client.generate(build_request([1, 2]), timeout=10)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert caught.value.details() == message
            assert sum(len(prefill.calls) for prefill in stack.tiers.prefill) == 1
            await stack.dispatcher.wait_aborts()
            assert len(stack.tiers.decode[0].aborts) == 1

    asyncio.run(body())


def test_reserve_resource_exhausted_moves_to_another_decode_worker(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            full, free = stack.tiers.decode
            full.knobs.failures.append(Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"))
            free.knobs.load.num_running = 3
            await stack.registry.poll()
            reply = await stack.client.generate(build_request([1]), timeout=10)
            assert reply.finish_reason == common_pb2.FINISH_REASON_LENGTH
            assert (len(full.reserves), len(free.reserves)) == (1, 1)

    asyncio.run(body())


def test_client_cancel_cancels_decode_and_aborts(router_stack: Any, wait_for: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack:
            decode = stack.tiers.decode[0]
            decode.knobs.delay_seconds = 0.2
            request = build_request([1], sampling=sampling(max_tokens=50), request_id="gone")
            async for _chunk in stack.client.generate_stream(request, timeout=30):
                break  # leaving the loop cancels the call
            gone = decode.reserves[0].request.request_id  # the router's id, not the client's
            await wait_for(lambda: gone in decode.cancelled and gone in decode.aborts)
            assert decode.reservations == {}

    before = _count("GenerateStream", "CANCELLED")
    asyncio.run(body())
    assert _count("GenerateStream", "CANCELLED") == before + 1


def test_client_cancel_during_prefill_reaches_prefill_and_decode(
    router_stack: Any, wait_for: Any
) -> None:
    async def body() -> None:
        async with router_stack() as stack:
            prefill, decode = stack.tiers.prefill[0], stack.tiers.decode[0]
            prefill.knobs.delay_seconds = 5.0
            call = asyncio.create_task(
                stack.client.generate(build_request([1], request_id="early"), timeout=30)
            )
            await wait_for(lambda: len(prefill.calls) == 1)
            call.cancel()
            early = prefill.calls[0].request.request_id
            await wait_for(lambda: early in prefill.cancelled and early in decode.aborts)

    asyncio.run(body())


def test_a_reserve_cut_short_with_its_answer_in_flight_is_aborted(
    router_stack: Any, wait_for: Any
) -> None:
    """Decode granted the reservation but the router stopped waiting for the answer (client
    cancel, deadline): only an Abort frees those blocks before decode's reservation TTL."""

    async def body() -> None:
        async with router_stack() as stack:
            decode = stack.tiers.decode[0]
            decode.knobs.reserve_answer_seconds = 5.0
            cancelled = asyncio.create_task(
                stack.client.generate(build_request([1], request_id="cancelled"), timeout=30)
            )
            await wait_for(lambda: len(decode.reservations) == 1)
            cancelled.cancel()
            await wait_for(lambda: decode.reservations == {})
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await stack.client.generate(build_request([1], request_id="late"), timeout=0.5)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await wait_for(lambda: decode.reservations == {})
            assert decode.aborts == [r.request.request_id for r in decode.reserves]

    asyncio.run(body())


def test_deadline_becomes_downstream_timeouts_and_deadline_exceeded(
    router_stack: Any, wait_for: Any
) -> None:
    async def body() -> None:
        async with router_stack() as stack:
            prefill, decode = stack.tiers.prefill[0], stack.tiers.decode[0]
            prefill.knobs.delay_seconds = 5.0
            request = build_request([1], request_id="late")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.client.generate(request, timeout=0.5)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            (remaining,) = prefill.time_remaining
            assert remaining is not None and 0 < remaining < 0.6  # the client's 0.5 s, passed on
            late = prefill.calls[0].request.request_id
            await wait_for(lambda: late in prefill.cancelled and late in decode.aborts)

    before = _count("Generate", "DEADLINE_EXCEEDED")
    asyncio.run(body())
    assert _count("Generate", "DEADLINE_EXCEEDED") == before + 1


def test_deadline_during_decode_cancels_the_stream(router_stack: Any, wait_for: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack:
            decode = stack.tiers.decode[0]
            decode.knobs.delay_seconds = 0.1
            request = build_request([1], sampling=sampling(max_tokens=100), request_id="slow")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.client.generate(request, timeout=0.5)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            slow = decode.reserves[0].request.request_id
            await wait_for(lambda: slow in decode.cancelled and slow in decode.aborts)

    before = _count("Generate", "DEADLINE_EXCEEDED")
    asyncio.run(body())
    assert _count("Generate", "DEADLINE_EXCEEDED") == before + 1


def test_max_queue_answers_resource_exhausted_at_once(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(max_queue=1) as stack:
            stack.tiers.decode[0].knobs.delay_seconds = 0.1
            first = stack.client.generate_stream(
                build_request([1], sampling=sampling(max_tokens=5)), timeout=10
            )
            chunks = [await anext(first)]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.client.generate(build_request([2]), timeout=10)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-queue 1" in (caught.value.details() or "")
            chunks += [chunk async for chunk in first]
            assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
            assert len(stack.tiers.decode[0].reserves) == 1
            # The slot is free again.
            stack.tiers.decode[0].knobs.delay_seconds = 0.0
            reply = await stack.client.generate(build_request([3]), timeout=10)
            assert reply.finish_reason == common_pb2.FINISH_REASON_LENGTH

    asyncio.run(body())


def test_max_queue_counts_every_sample_as_a_stream(router_stack: Any) -> None:
    """Before, a request with n = 16 took one place and ran 16 streams."""

    async def body() -> None:
        async with router_stack(max_queue=3) as stack:
            stack.tiers.decode[0].knobs.delay_seconds = 0.1
            two = build_request([1], sampling=sampling(max_tokens=5, n=2))
            first = stack.client.generate_stream(two, timeout=10)
            chunks = [await anext(first)]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.client.generate(two, timeout=10)  # 2 + 2 streams > 3
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "runs 2" in (caught.value.details() or "")
            reply = await stack.client.generate(build_request([2]), timeout=10)  # 2 + 1 fit
            assert reply.finish_reason == common_pb2.FINISH_REASON_LENGTH
            chunks += [chunk async for chunk in first]
            assert {chunk.sample_index for chunk in chunks} == {0, 1}
            with pytest.raises(grpc.aio.AioRpcError) as never:
                await stack.client.generate(build_request([3], sampling=sampling(n=4)))
            assert never.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (never.value.details() or "").startswith("sampling.n")

    asyncio.run(body())


def test_one_client_id_twice_in_flight_runs_twice_under_the_routers_ids(
    router_stack: Any,
) -> None:
    """Client ids are only echoed: the same one twice in flight is two requests, each with its
    own tokens, run on the workers under two ids of the router's own."""

    async def body() -> None:
        async with router_stack() as stack:
            decode = stack.tiers.decode[0]
            decode.knobs.delay_seconds = 0.1
            first = stack.client.generate_stream(
                build_request([1], sampling=sampling(max_tokens=4), request_id="twin"),
                timeout=10,
            )
            chunks = [await anext(first)]
            second = await stack.client.generate(
                build_request([2], sampling=sampling(max_tokens=3), request_id="twin"), timeout=10
            )
            chunks += [chunk async for chunk in first]
            assert {chunk.request_id for chunk in chunks} == {"twin"} == {second.request_id}
            assert [token for chunk in chunks for token in chunk.token_ids] == [
                FIRST_TOKEN_ID,
                1,
                2,
                3,
            ]
            assert list(second.token_ids) == [FIRST_TOKEN_ID, 1, 2]
            ids = [reserve.request.request_id for reserve in decode.reserves]
            assert len(set(ids)) == 2 and "twin" not in ids
            assert decode.aborts == []

    asyncio.run(body())


def test_no_healthy_worker_is_unavailable(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack() as stack:
            stack.tiers.decode[0].knobs.load_fails = True
            await stack.registry.poll()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.client.generate(build_request([1]), timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "no healthy decode worker" in (caught.value.details() or "")
            stack.tiers.decode[0].knobs.load_fails = False
            await stack.registry.poll()
            reply = await stack.client.generate(build_request([1]), timeout=10)
            assert reply.finish_reason == common_pb2.FINISH_REASON_LENGTH

    asyncio.run(body())


def test_a_reserve_refused_by_a_draining_worker_leaves_it_healthy(router_stack: Any) -> None:
    """A draining decode worker refuses new reservations with UNAVAILABLE but answers Load: it
    is not marked dead (its reservations still queued for prefill are redirected, not prefilled
    again); the request is reserved on the other worker."""

    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            draining, other = stack.tiers.decode
            refusal = Failure(grpc.StatusCode.UNAVAILABLE, "this worker is draining")
            draining.knobs.failures.append(refusal)
            other.knobs.load.num_running = 3  # so the router reserves on the draining one first
            await stack.registry.poll()
            reply = await stack.client.generate(build_request([1]), timeout=10)
            assert reply.finish_reason == common_pb2.FINISH_REASON_LENGTH
            assert (len(draining.reserves), len(other.reserves)) == (1, 1)
            assert stack.registry.decode.healthy_count() == 2

    asyncio.run(body())
