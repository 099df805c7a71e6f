"""router/samples.py: how `sampling.n` is fanned out and merged (the cluster test runs it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.router.samples import interleave, merge_responses, sample_requests, stream_count
from pdserve.router.validation import ValidatedRequest
from pdserve.v1 import common_pb2, generation_pb2


def _request(n: int, seed: int | None = 5) -> ValidatedRequest:
    sampling = common_pb2.SamplingParams(max_tokens=4, temperature=0.5, n=n)
    if seed is not None:
        sampling.seed = seed
    return ValidatedRequest("r", "client-r", (1, 2, 3), sampling, 0)


def test_samples_get_their_own_ids_and_derived_seeds() -> None:
    samples = sample_requests(_request(3))
    assert [s.request_id for s in samples] == ["r/0", "r/1", "r/2"]
    assert [s.sampling.seed for s in samples] == [5, 6, 7]
    assert all(s.sampling.n == 1 and s.prompt_token_ids == (1, 2, 3) for s in samples)
    assert not any(s.sampling.HasField("seed") for s in sample_requests(_request(2, seed=None)))


def test_one_sample_is_the_request_itself() -> None:
    request = _request(0)  # the zero value means one
    assert [s.request_id for s in sample_requests(request)] == ["r"]


def test_each_sample_is_a_stream_and_too_many_name_the_field() -> None:
    def asking(n: int) -> generation_pb2.GenerateRequest:
        return generation_pb2.GenerateRequest(sampling=common_pb2.SamplingParams(n=n))

    assert [stream_count(asking(n), max_queue=8) for n in (0, 1, 8)] == [1, 1, 8]
    with pytest.raises(InvalidRequestError, match=r"sampling\.n: at most 16"):
        stream_count(asking(17), max_queue=256)
    with pytest.raises(InvalidRequestError, match=r"sampling\.n: 9 samples can never fit"):
        stream_count(asking(9), max_queue=8)


def test_merged_answer_lists_every_sample_and_repeats_the_first() -> None:
    answers = [
        generation_pb2.GenerateResponse(request_id=f"r/{i}", token_ids=[i, i], text=str(i))
        for i in range(2)
    ]
    merged = merge_responses("r", answers)
    assert merged.request_id == "r" and list(merged.token_ids) == [0, 0]
    assert [(s.index, list(s.token_ids), s.text) for s in merged.samples] == [
        (0, [0, 0], "0"),
        (1, [1, 1], "1"),
    ]


def test_interleave_tags_items_and_stops_all_on_the_first_error() -> None:
    closed: list[int] = []

    async def stream(index: int, fail: bool) -> AsyncGenerator[int, None]:
        try:
            yield index
            if fail:
                raise RuntimeError("sample failed")
            await asyncio.sleep(10)
            yield index
        finally:
            closed.append(index)

    async def run() -> list[tuple[int, int]]:
        seen = []
        with pytest.raises(RuntimeError, match="sample failed"):
            async for item in interleave([stream(0, False), stream(1, True)]):
                seen.append(item)
        return seen

    assert sorted(asyncio.run(run())) == [(0, 0), (1, 1)]
    assert sorted(closed) == [0, 1]
