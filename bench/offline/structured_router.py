"""`pdserve bench structured --router ADDRESS`: the benchmark's passes through a running cluster
(`pdserve up`: router -> prefill -> UCX -> decode) instead of an in-process engine. The same
requests and modes; the workers' own steps and mask times are on their /metrics
(`pdserve_TIER_structured_*`), not in these rows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from pdserve.client import GenerationClient, build_request
from pdserve.core.outputs import FinishReason
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.serving.sampling_proto import sampling_to_proto
from pdserve.v1 import common_pb2

TIMEOUT_S = 600.0
_FINISH = {
    common_pb2.FINISH_REASON_STOP: FinishReason.STOP,
    common_pb2.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    common_pb2.FINISH_REASON_ABORTED: FinishReason.ABORTED,
}


async def all_at_once(
    address: str, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]
) -> tuple[list[tuple[tuple[int, ...], str, FinishReason]], float]:
    """Every request at once; each one's (tokens, text, finish) and the wall time."""
    async with GenerationClient.connect(address) as client:
        started = time.perf_counter()
        replies = await asyncio.gather(
            *(
                client.generate(
                    build_request(list(prompt), sampling=sampling_to_proto(sampling)),
                    timeout=TIMEOUT_S,
                )
                for prompt, sampling in zip(prompts, params, strict=True)
            )
        )
        seconds = time.perf_counter() - started
    outputs = [
        (tuple(reply.token_ids), reply.text, _FINISH[reply.finish_reason]) for reply in replies
    ]
    return outputs, seconds


async def one_at_a_time(
    address: str, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]
) -> tuple[list[tuple[tuple[int, ...], str, FinishReason]], float, float, int]:
    """Each request alone, streamed; outputs, wall time, decode seconds (first chunk to last)
    and the tokens after the first."""
    outputs = []
    decode_seconds = 0.0
    tokens_after_first = 0
    async with GenerationClient.connect(address) as client:
        started = time.perf_counter()
        for prompt, sampling in zip(prompts, params, strict=True):
            request = build_request(list(prompt), sampling=sampling_to_proto(sampling))
            tokens: list[int] = []
            text = ""
            finish = FinishReason.ABORTED
            first_at = last_at = 0.0
            async for chunk in client.generate_stream(request, timeout=TIMEOUT_S):
                last_at = time.perf_counter()
                first_at = first_at or last_at
                tokens.extend(chunk.token_ids)
                text += chunk.text
                finish = _FINISH.get(chunk.finish_reason, finish)
            outputs.append((tuple(tokens), text, finish))
            decode_seconds += last_at - first_at
            tokens_after_first += len(tokens) - 1
        seconds = time.perf_counter() - started
    return outputs, seconds, decode_seconds, tokens_after_first
