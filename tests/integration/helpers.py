"""Small helpers for integration tests: worker load, metrics, blocks-free polling."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any

import grpc

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.core import sampling_params
from pdserve.core.serving.sampling_proto import sampling_to_proto
from pdserve.core.structured.params import StructuredOutputsParams
from pdserve.local.cluster import Cluster, Process
from pdserve.v1 import common_pb2, decode_pb2_grpc, generation_pb2, prefill_pb2_grpc
from tests.structured_cases import CASES, assert_follows
from tests.structured_cases import MAX_TOKENS as STRUCTURED_MAX_TOKENS


def load(process: Process) -> common_pb2.LoadResponse:
    with grpc.insecure_channel(process.address) as channel:
        stub_class = (
            prefill_pb2_grpc.PrefillStub
            if process.role == "prefill"
            else decode_pb2_grpc.DecodeStub
        )
        reply: common_pb2.LoadResponse = stub_class(channel).Load(
            common_pb2.LoadRequest(), timeout=5
        )
        return reply


def workers(cluster: Cluster) -> list[Process]:
    return [*cluster.prefill, *cluster.decode]


def all_blocks_free(cluster: Cluster) -> bool:
    """On every worker still running (one that exited holds nothing)."""
    for process in _running(cluster):
        reply = load(process)
        if (
            reply.num_free_blocks != reply.num_total_blocks
            or reply.num_running
            or reply.num_waiting
        ):
            return False
    return True


def wait_all_blocks_free(cluster: Cluster, timeout_s: float = 15.0) -> None:
    """Blocks are freed asynchronously after a cancel; give the tiers a moment, then insist."""
    deadline = time.monotonic() + timeout_s
    while not all_blocks_free(cluster):
        if time.monotonic() > deadline:
            states = {f"{p.role}-{p.index}": load(p) for p in _running(cluster)}
            raise AssertionError(f"blocks still held after {timeout_s}s: {states}")
        time.sleep(0.1)


def _running(cluster: Cluster) -> list[Process]:
    return [process for process in workers(cluster) if process.popen.poll() is None]


def metric(process: Process, name: str) -> float:
    """The value of one unlabelled metric from the process's /metrics page."""
    url = f"http://{process.host}:{process.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise KeyError(f"{name} not on {url}")


def labelled_metric(process: Process, name: str, **labels: str) -> float:
    """The value of one labelled sample (0 when the labels were never counted)."""
    url = f"http://{process.host}:{process.metrics_port}/metrics"
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    with urllib.request.urlopen(url, timeout=5) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(f"{name}{{{wanted}}} "):
                return float(line.split()[1])
    return 0.0


async def greedy_outputs(
    cluster: Cluster, prompts: list[list[int]], max_tokens: int
) -> list[list[int]]:
    """Every prompt through the router at once, greedy; the token ids of each reply."""
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    async with GenerationClient.connect(cluster.router.address) as client:
        replies = await asyncio.gather(
            *(client.generate(build_request(p, sampling=sampling)) for p in prompts)
        )
    return [list(reply.token_ids) for reply in replies]


async def cancel_while_sharing(cluster: Cluster, long: list[int], short: list[int]) -> int:
    """Streams `long` endlessly; after its first token runs `short` (which shares its prefix, so
    it takes references on the blocks `long` holds) to the end, then cancels `long` after three
    tokens. Returns the tokens `long` streamed."""
    endless = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True)
    few = SamplingParams(max_tokens=4, temperature=0.0)
    received = 0
    async with GenerationClient.connect(cluster.router.address) as client:
        async for chunk in client.generate_stream(build_request(long, sampling=endless)):
            received += len(chunk.token_ids)
            if received == 1:
                await client.generate(build_request(short, sampling=few))
            if received >= 3:
                break  # leaving the loop cancels the call
    return received


async def cancel_stream_after(cluster: Cluster, prompt: list[int], tokens: int = 3) -> int:
    """Streams a long greedy generation and cancels it once `tokens` tokens arrived; returns
    how many arrived (at least `tokens` unless the stream ended first)."""
    sampling = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    received = 0
    async with GenerationClient.connect(cluster.router.address) as client:
        async for chunk in client.generate_stream(build_request(prompt, sampling=sampling)):
            received += len(chunk.token_ids)
            if received >= tokens:
                break  # leaving the loop cancels the call
    return received


def structured_request(
    prompt: list[int], structured: StructuredOutputsParams, **sampling: Any
) -> generation_pb2.GenerateRequest:
    """A greedy request under `structured` (`sampling` overrides the defaults)."""
    params = sampling_params.SamplingParams(
        **{"max_tokens": STRUCTURED_MAX_TOKENS, "temperature": 0.0, **sampling},
        structured_outputs=structured,
    )
    return build_request(prompt, sampling=sampling_to_proto(params))


async def generate_all(
    cluster: Cluster, requests: list[generation_pb2.GenerateRequest]
) -> list[generation_pb2.GenerateResponse]:
    """Every request through the router at once; the replies in order."""
    async with GenerationClient.connect(cluster.router.address) as client:
        return list(await asyncio.gather(*(client.generate(r) for r in requests)))


def assert_every_case_as_transformers(
    cluster: Cluster, structured_prompts: list[list[int]], reference: list[list[int]]
) -> None:
    """Each of tests/structured_cases.py's CASES, greedy under its constraint, all at once
    through the router: transformers' tokens under the same mask, text that follows it."""
    requests = [
        structured_request(prompt, structured)
        for prompt, (_, structured) in zip(structured_prompts, CASES, strict=True)
    ]
    replies = asyncio.run(generate_all(cluster, requests))
    assert [list(reply.token_ids) for reply in replies] == reference
    for reply, (_, structured) in zip(replies, CASES, strict=True):
        assert_follows(reply.text, structured)
