"""What `pdserve bench migration`'s measurements share: a fresh cluster of 1 prefill and 2 decode
workers (loopback or pods), the streams they serve, and their prompts."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster, ClusterSpec, Process
from pdserve.local.netns import LinkShaping
from pdserve.local.ports import free_port_bases
from pdserve.v1 import common_pb2, decode_pb2_grpc

FIRST_ORDINARY_TOKEN = 100  # clear of the special tokens at the start of the vocabulary
TOKENS_BEFORE_MOVE = 8
MAX_TOKENS = 32
UCX_ENV = (("UCX_WARN_UNUSED_ENV_VARS", "n"),)


class RunningCluster(Protocol):
    """What this benchmark reads of a loopback `Cluster` or a `PodCluster`."""

    @property
    def router(self) -> Process: ...

    @property
    def decode(self) -> list[Process]: ...


@dataclass
class Stream:
    tokens: list[int]
    times: list[float]


async def serve_stream(
    client: GenerationClient, prompt: tuple[int, ...], stream: Stream, max_tokens: int = MAX_TOKENS
) -> None:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    async for chunk in client.generate_stream(
        build_request(list(prompt), sampling=sampling), timeout=600
    ):
        if chunk.token_ids:
            stream.times.append(time.monotonic())
            stream.tokens.extend(chunk.token_ids)


async def until_each_has(streams: list[Stream], tokens: int) -> None:
    while min(len(s.tokens) for s in streams) < tokens:
        await asyncio.sleep(0.002)


async def num_running(worker: Process) -> int:
    async with grpc.aio.insecure_channel(worker.address) as channel:
        load = await decode_pb2_grpc.DecodeStub(channel).Load(common_pb2.LoadRequest())
    return int(load.num_running)


@contextlib.contextmanager
def running_cluster(
    args: argparse.Namespace, model_dir: Path, name: str, prefill_args: tuple[str, ...] = ()
) -> Iterator[RunningCluster]:
    """A fresh, ready cluster of 1 prefill and 2 decode workers, stopped on the way out."""
    base_port, metrics_base_port = free_port_bases(2)
    spec = ClusterSpec(
        model_dir=model_dir,
        num_prefill=1,
        num_decode=2,
        prefill_args=prefill_args,
        base_port=base_port,
        metrics_base_port=metrics_base_port,
        env=UCX_ENV,
        drain_grace_seconds=120.0,
    )
    log_dir = None if args.log_dir is None else args.log_dir / name
    if args.netns:
        from pdserve.local.pods import PodCluster  # dnslib: only under --netns

        with PodCluster(spec, LinkShaping(rate=args.link_rate), log_dir) as pods:
            yield pods
        return
    with Cluster(spec, log_dir) as cluster:
        cluster.wait_ready()
        yield cluster


def link_name(args: argparse.Namespace) -> str:
    if not args.netns:
        return "loopback"
    return "netns" if args.link_rate is None else f"netns {args.link_rate}"


def random_prompt(rng: random.Random, count: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(count))
