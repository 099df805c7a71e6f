"""The router's end of Decode.Multiplex over a fake decode worker (real grpc.aio on 127.0.0.1):
one stream per decode worker for all requests, deltas coalesced only for a consumer that falls
behind, per-request errors and cancels as on a request's own call; and the per-request path
(--relay per-request) kept beside it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from pdserve.client import build_request
from pdserve.core.serving.keepalive import Keepalive
from pdserve.router.clock import Deadline, RequestClock
from pdserve.router.config import RelayMode
from pdserve.testing.fake_tiers import FIRST_TOKEN_ID, Failure, FakeDecode
from pdserve.v1 import common_pb2, decode_pb2

MAX_TOKENS = 12
EXPECTED = [FIRST_TOKEN_ID, *range(1, MAX_TOKENS)]


def _request(max_tokens: int = MAX_TOKENS) -> Any:
    return build_request([5, 6, 7], sampling=common_pb2.SamplingParams(max_tokens=max_tokens))


async def _consume(stack: Any, pause_s: float) -> list[decode_pb2.TokenDelta]:
    """One request's deltas through admission (what both doors relay), `pause_s` after each
    (a slow client: its door is still sending the previous one)."""
    admission = stack.servicer.admission
    got: list[decode_pb2.TokenDelta] = []
    async with admission.admitted(_request()) as valid:
        deltas = admission.deltas(valid, Deadline(None), RequestClock())
        async with contextlib.aclosing(deltas):
            async for delta in deltas:
                got.append(delta)
                await asyncio.sleep(pause_s)
    return got


def test_a_slow_consumer_gets_coalesced_deltas_while_a_fast_one_gets_every_token(
    router_stack: Any,
) -> None:
    async def body() -> None:
        async with router_stack() as stack:
            stack.tiers.decode[0].knobs.delay_seconds = 0.02  # between two engine steps
            fast, slow = await asyncio.gather(_consume(stack, 0.0), _consume(stack, 0.09))
            for deltas in (fast, slow):
                assert [t for d in deltas for t in d.token_ids] == EXPECTED
                assert "".join(d.text for d in deltas) == "".join(f"<{t}>" for t in EXPECTED)
                assert deltas[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
                assert deltas[-1].usage.completion_tokens == MAX_TOKENS
            assert [len(d.token_ids) for d in fast] == [1] * MAX_TOKENS  # each as it was made
            assert len(slow) < MAX_TOKENS / 2  # what waited came as one
            assert max(len(d.token_ids) for d in slow) >= 3

    asyncio.run(body())


def test_concurrent_requests_share_one_stream_per_decode_worker(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            calls = [stack.client.generate(_request(), timeout=10) for _ in range(16)]
            replies = await asyncio.gather(*calls)
            assert all(list(reply.token_ids) == EXPECTED for reply in replies)
            streams = [decode.multiplex_calls for decode in stack.tiers.decode]
            assert streams == [1, 1]  # 16 requests, two workers: one stream each
            # One message carried the step of several requests.
            assert max(decode.largest_step for decode in stack.tiers.decode) > 1

    asyncio.run(body())


def test_a_start_error_ends_that_request_only_with_its_code(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(disagg_threshold=100) as stack:  # GenerateLocal on decode
            decode = stack.tiers.decode[0]
            decode.knobs.failures = [Failure(grpc.StatusCode.INVALID_ARGUMENT, "sampling: bad")]
            failing = stack.client.generate(_request(), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await failing
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == "sampling: bad"
            reply = await stack.client.generate(_request(), timeout=10)  # the same stream
            assert list(reply.token_ids) == [0, *range(1, MAX_TOKENS)]
            assert decode.multiplex_calls == 1

    asyncio.run(body())


def test_a_deadline_mid_stream_cancels_the_request_on_decode(
    router_stack: Any, wait_for: Any
) -> None:
    async def body() -> None:
        async with router_stack() as stack:
            decode = stack.tiers.decode[0]
            decode.knobs.delay_seconds = 0.1
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.client.generate(_request(max_tokens=100), timeout=0.6)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            request_id = decode.reserves[-1].request.request_id
            await wait_for(lambda: request_id in decode.cancelled and request_id in decode.aborts)

    asyncio.run(body())


def test_the_per_request_path_relays_the_same_answer(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(relay=RelayMode.PER_REQUEST) as stack:
            chunks = [c async for c in stack.client.generate_stream(_request(), timeout=10)]
            assert [t for c in chunks for t in c.token_ids] == EXPECTED
            assert len(chunks) == MAX_TOKENS
            assert chunks[-1].usage == common_pb2.Usage(prompt_tokens=3, completion_tokens=12)
            assert stack.tiers.decode[0].multiplex_calls == 0

    asyncio.run(body())


def test_a_stream_broken_with_any_code_migrates_every_request_on_it(router_stack: Any) -> None:
    """Before, a Multiplex stream that ended INTERNAL failed its requests with it; a broken
    stream is a lost worker for all of them, whatever the code."""

    async def one(stack: Any, index: int) -> list[int]:
        request = build_request([index + 1], sampling=common_pb2.SamplingParams(max_tokens=8))
        chunks = [c async for c in stack.client.generate_stream(request, timeout=20)]
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        return [t for chunk in chunks for t in chunk.token_ids]

    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            broken, other = stack.tiers.decode
            broken.knobs.lost_after_tokens = 3
            broken.knobs.lost_code = grpc.StatusCode.INTERNAL
            other.knobs.load.num_waiting = 100  # the router starts them on the broken one
            await stack.registry.poll()
            outputs = await asyncio.gather(*(one(stack, index) for index in range(8)))
            for tokens in outputs:  # what came before the break (maybe nothing), then the rest
                cut = max(k for k, token in enumerate(tokens) if token == FIRST_TOKEN_ID)
                before = [FIRST_TOKEN_ID, *range(1, cut)] if cut else []
                assert tokens == [*before, FIRST_TOKEN_ID, *range(1, 8 - cut)]
            continued = [r.request for r in other.reserves if r.request.resumed_output_token_ids]
            assert len(continued) >= 2  # more than the one whose run broke the stream

    asyncio.run(body())


@pytest.mark.parametrize("relay", list(RelayMode), ids=[mode.value for mode in RelayMode])
def test_a_wedged_decode_engine_fails_its_streams_over(router_stack: Any, relay: RelayMode) -> None:
    """The decode worker answers Load but reports one engine step running past
    --engine-stall-seconds (its engine thread is stuck; its gRPC server is not, so keepalive
    never fires): the router gives it up and the streams on it continue on the other worker,
    without repeats, on either relay. Before, they waited for it for ever (the per-request
    relay's until its own fix)."""

    async def wedge(stack: Any, wedged: FakeDecode) -> None:
        wedged.knobs.load.step_running_seconds = 6.0
        await stack.registry.poll()

    async def body() -> None:
        async with router_stack(num_decode=2, engine_stall_seconds=5.0, relay=relay) as stack:
            await _streams_move_when_the_first_worker_is_lost(stack, wedge)

    asyncio.run(body())


@pytest.mark.parametrize("relay", list(RelayMode), ids=[mode.value for mode in RelayMode])
def test_a_decode_worker_silent_for_the_keepalive_window_fails_its_streams_over(
    router_stack: Any, relay: RelayMode
) -> None:
    """A pod cut off under load whose connection keepalive has not closed (its pings queued
    behind writes that never leave) sends no delta and answers no Load: once nothing has come
    from it for keepalive's time + timeout, the router gives it up and its streams go on
    elsewhere, on either relay. The fake answers pings, so only the router's own silence rule
    can find it."""
    keepalive = Keepalive(time_seconds=0.5, timeout_seconds=0.5)

    async def silence(stack: Any, silent: FakeDecode) -> None:
        silent.knobs.delay_seconds = 30.0  # its stream stops...
        silent.knobs.load_delay_seconds = 30.0  # ...and so do its Load answers
        worker = stack.registry.decode.workers[stack.tiers.decode_addresses[0]]
        for _ in range(20):
            await stack.registry.poll()
            if worker.given_up:
                return
            await asyncio.sleep(0.25)

    async def body() -> None:
        async with router_stack(
            num_decode=2, keepalive=keepalive, load_timeout_seconds=0.2, relay=relay
        ) as stack:
            await _streams_move_when_the_first_worker_is_lost(stack, silence)
            worker = stack.registry.decode.workers[stack.tiers.decode_addresses[0]]
            assert worker.given_up

    asyncio.run(body())


def test_a_busy_decode_worker_still_streaming_is_not_given_up(router_stack: Any) -> None:
    """Late Load answers alone (a busy worker) are not silence while its stream's deltas come."""

    async def body() -> None:
        keepalive = Keepalive(time_seconds=0.2, timeout_seconds=0.2)
        async with router_stack(
            num_decode=1, keepalive=keepalive, load_timeout_seconds=0.1
        ) as stack:
            (busy,) = stack.tiers.decode
            busy.knobs.delay_seconds = 0.1  # a token every 0.1 s for 2 s
            await stack.registry.poll()
            busy.knobs.load_delay_seconds = 30.0  # every Load from now on answers too late
            request = build_request([1], sampling=common_pb2.SamplingParams(max_tokens=20))
            tokens: list[int] = []
            async for chunk in stack.client.generate_stream(request, timeout=20):
                tokens.extend(chunk.token_ids)
                if len(tokens) % 4 == 0:  # a poll about every 0.4 s, past the 0.4 s window
                    await stack.registry.poll()
            worker = stack.registry.decode.workers[stack.tiers.decode_addresses[0]]
            assert len(tokens) == 20 and not worker.given_up and worker.failed_polls >= 4

    asyncio.run(body())


async def _streams_move_when_the_first_worker_is_lost(
    stack: Any, lose: Callable[[Any, FakeDecode], Awaitable[None]]
) -> None:
    """A stream starts on the first decode worker (a token every 0.2 s: still streaming when
    `lose` runs, after its second token); it ends on the other, without repeats."""
    first, other = stack.tiers.decode
    first.knobs.delay_seconds = 0.2
    other.knobs.load.num_waiting = 100  # the router starts the stream on the first one
    await stack.registry.poll()
    request = build_request([1], sampling=common_pb2.SamplingParams(max_tokens=8))
    tokens: list[int] = []
    async for chunk in stack.client.generate_stream(request, timeout=20):
        tokens.extend(chunk.token_ids)
        if len(tokens) == 2:
            other.knobs.load.num_waiting = 0
            await lose(stack, first)
    assert tokens[:2] == [FIRST_TOKEN_ID, 1]
    assert len(tokens) == 8 and other.reserves  # continued on the other worker
    assert not stack.registry.decode.workers[stack.tiers.decode_addresses[0]].healthy
