"""What one client saw of one streamed request, through gRPC or the OpenAI HTTP door: the chaos
tests compare it with the undisturbed run's."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import openai

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.v1 import common_pb2


@dataclass
class Stream:
    """Equal to another when the client saw the same tokens, text, finish and usage; when each
    chunk arrived does not count."""

    token_ids: list[int] = field(default_factory=list)  # gRPC only: HTTP streams carry text
    text: str = ""
    finish: str = ""
    usage: tuple[int, int] = (0, 0)
    chunk_times: list[float] = field(default_factory=list, compare=False)


async def stream_grpc(
    client: GenerationClient, prompt: list[int], sampling: SamplingParams, stream: Stream
) -> None:
    """Fills `stream` as the chunks arrive, so a caller sees progress while it runs."""
    request = build_request(prompt, sampling=sampling)
    async for chunk in client.generate_stream(request, timeout=300):
        stream.chunk_times.append(time.monotonic())
        stream.token_ids.extend(chunk.token_ids)
        stream.text += chunk.text
        if chunk.finish_reason:
            stream.finish = common_pb2.FinishReason.Name(chunk.finish_reason)
            stream.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)


def stream_http(http_url: str, prompt: list[int], sampling: SamplingParams, stream: Stream) -> None:
    """The same request through the OpenAI completions door (`http_url` ends in /v1)."""
    with openai.OpenAI(base_url=http_url, api_key="unused", max_retries=0) as client:
        chunks = client.completions.create(
            model=client.models.list().data[0].id,
            prompt=prompt,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p or 1.0,  # unset in the proto means no filter
            seed=sampling.seed if sampling.HasField("seed") else None,
            stop=list(sampling.stop),
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": sampling.ignore_eos},
            timeout=300,
        )
        for chunk in chunks:
            stream.chunk_times.append(time.monotonic())
            for choice in chunk.choices:
                stream.text += choice.text
                stream.finish = choice.finish_reason or stream.finish
            if chunk.usage is not None:
                stream.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
