"""An open-loop load of request kinds (greedy and seeded sampling, gRPC and HTTP, a stop string
held back) through a router, each outcome kept to compare with an undisturbed run: what
tests/chaos/test_elastic.py sends while tiers scale, pods die and links are cut."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from pdserve.client import GenerationClient, SamplingParams

from .streams import Stream, stream_grpc, stream_http

MAX_TOKENS = 16
NEVER = "@@ this never appears in the output @@"  # every stream holds text back for it
ARRIVAL_INTERVAL_S = 0.3  # open loop: a new request every interval...
# ...while fewer than this many are in flight. Without the bound, a host slower than the arrival
# rate queued streams without end: scale-downs waited out their 60 s drain grace and the test ran
# for 20 minutes on 2 cores. Eight streams keep every worker busy through each step.
MAX_IN_FLIGHT = 8
# After each scale step the new shape serves for a while: at one arrival every 0.3 s, about six
# requests (4 s took 36 s of the module's time in sleeps).
SETTLE_UNDER_LOAD_S = 2.0


class Target(Protocol):
    """Where the load goes, and the prompts a kind's index picks from."""

    @property
    def router(self) -> str: ...

    @property
    def http_url(self) -> str: ...

    @property
    def prompts(self) -> list[list[int]]: ...


@dataclass(frozen=True)
class Kind:
    """What a request is, so that its outcome can be compared with the undisturbed run."""

    prompt: int  # index into the prompts used
    seeded: bool  # seeded sampling, else greedy
    http: bool  # the OpenAI HTTP door, else gRPC streaming
    stop: str = NEVER  # or a piece of the undisturbed text: the stream ends there

    def sampling(self) -> SamplingParams:
        if not self.seeded:
            return SamplingParams(
                max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, stop=[self.stop]
            )
        return SamplingParams(
            max_tokens=MAX_TOKENS,
            temperature=0.9,
            top_p=0.95,
            seed=1000 + self.prompt,
            ignore_eos=True,
            stop=[self.stop],
        )


BASE_KINDS = [
    Kind(p, seeded, http) for p in range(4) for seeded in (False, True) for http in (False, True)
]


async def under_load(
    target: Target, disturbance: Awaitable[None], kinds: list[Kind]
) -> list[tuple[Kind, Stream]]:
    """Open-loop load (one request every ARRIVAL_INTERVAL_S while fewer than MAX_IN_FLIGHT are in
    flight, `kinds` in turn) for as long as `disturbance` runs, and at least one request of each
    kind however soon it ends; every request's outcome."""
    stop = asyncio.Event()
    load = asyncio.ensure_future(_open_loop(target, kinds, stop))
    try:
        await asyncio.sleep(SETTLE_UNDER_LOAD_S)  # streams in flight before the first step
        await disturbance
    finally:
        stop.set()
    return await load


async def _open_loop(
    target: Target, send: list[Kind], stop: asyncio.Event
) -> list[tuple[Kind, Stream]]:
    _enough_threads()
    async with GenerationClient.connect(target.router) as client:
        tasks: list[asyncio.Future[Stream]] = []
        kinds: list[Kind] = []
        while not stop.is_set() or len(tasks) < len(send):
            if sum(not task.done() for task in tasks) >= MAX_IN_FLIGHT:
                await asyncio.sleep(0.05)
                continue
            kind = send[len(tasks) % len(send)]
            prompt = target.prompts[kind.prompt]
            kinds.append(kind)
            tasks.append(asyncio.ensure_future(_one(client, target.http_url, prompt, kind)))
            await asyncio.sleep(ARRIVAL_INTERVAL_S)
        return list(zip(kinds, await asyncio.gather(*tasks), strict=True))


async def run_all(
    router: str, http_url: str, prompts: list[list[int]], kinds: list[Kind]
) -> list[Stream]:
    _enough_threads()
    async with GenerationClient.connect(router) as client:
        return list(
            await asyncio.gather(*(_one(client, http_url, prompts[k.prompt], k) for k in kinds))
        )


def _enough_threads() -> None:
    """HTTP streams run in threads: enough for every one in flight, so arrivals stay open-loop
    (the default pool has CPUs + 4)."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=64))


async def _one(client: GenerationClient, http_url: str, prompt: list[int], kind: Kind) -> Stream:
    outcome = Stream()
    if kind.http:
        await asyncio.to_thread(stream_http, http_url, prompt, kind.sampling(), outcome)
    else:
        await stream_grpc(client, prompt, kind.sampling(), outcome)
    return outcome
