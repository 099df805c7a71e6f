"""The real side of the planner's checks: a pinned cluster on this machine, a trace driven through
its router, and what each request saw.

Used by `pdserve simulate --validate` (the simulator against the real thing), `pdserve profile
--serving` (the serving costs the offline profile misses) and `pdserve plan --verify` (the chosen
plan, run). Workers are pinned (one torch thread each), by tier (`tier_cores`: prefill workers
share core 0, decode workers core 1) or one core each (`own_cores`); the router and the load
generator run unpinned beside them. Arrival times come from the load runner's own schedule
(`arrivals`), so a simulation can be handed exactly the times the real run used.

Prompts are random ordinary token ids drawn from a seed the caller names per run: a point of a
validation never replays another's prompts, so the prefix cache (on unless the engine config says
otherwise) finds only what a trace says is shared (`TraceRequest.prefix_id`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.loadtest.calls import CallResult
from pdserve.loadtest.config import LoadConfig, Method
from pdserve.loadtest.driver import drive
from pdserve.loadtest.schedule import POISSON_SEED, ArrivalSchedule, LoadSchedule
from pdserve.local.cluster import Cluster, ClusterSpec, CpuPin
from pdserve.local.ports import free_port_bases
from pdserve.planner.workload import TraceRequest

FIRST_ID, VOCAB = 100, 49152  # random prompt ids: SmolLM2's vocabulary without its special ids
PREFILL_CORE, DECODE_CORE = 0, 1
UCX_ENV = (("UCX_WARN_UNUSED_ENV_VARS", "n"),)


@dataclass(frozen=True)
class Seen:
    """What one request of a trace saw at the client (seconds)."""

    ttft_s: float | None  # None: it failed before its first token
    gaps_s: tuple[float, ...]  # between token-carrying stream chunks
    output_tokens: int
    ok: bool

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (a chunk of k tokens counts k)."""
        return sum(self.gaps_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def engine_flags(engine: EngineConfig) -> tuple[str, ...]:
    """The worker flags that give `engine` (only what differs from the workers' defaults)."""
    defaults = EngineConfig()
    flags: list[str] = []
    for field in dataclasses.fields(EngineConfig):
        value = getattr(engine, field.name)
        if value == getattr(defaults, field.name):
            continue
        if field.name == "enable_prefix_caching":
            flags.append("--no-prefix-cache")  # the only non-default a bool can take
            continue
        text = value.value if hasattr(value, "value") else str(value)
        flags += [f"--{field.name.replace('_', '-')}", text]
    return tuple(flags)


def tier_cores(num_prefill: int, num_decode: int) -> tuple[CpuPin, ...]:
    """Prefill workers share core 0, decode workers core 1 (the validation's layout)."""
    prefill = tuple(CpuPin("prefill", i, (PREFILL_CORE,)) for i in range(num_prefill))
    return prefill + tuple(CpuPin("decode", i, (DECODE_CORE,)) for i in range(num_decode))


def own_cores(num_prefill: int, num_decode: int) -> tuple[CpuPin, ...]:
    """One core per worker, prefill first: what a plan sized in whole workers assumes."""
    roles = [("prefill", i) for i in range(num_prefill)] + [
        ("decode", i) for i in range(num_decode)
    ]
    cpus = sorted(os.sched_getaffinity(0))
    if len(roles) > len(cpus):
        raise ValueError(f"{len(roles)} workers need as many cores; this machine has {cpus}")
    return tuple(
        CpuPin(role, index, (cpu,)) for (role, index), cpu in zip(roles, cpus, strict=False)
    )


@contextlib.contextmanager
def running_cluster(
    num_prefill: int,
    num_decode: int,
    model_dir: Path,
    engine: EngineConfig,
    router_args: tuple[str, ...],
    log_dir: Path,
    pins: tuple[CpuPin, ...] | None = None,
) -> Iterator[Cluster]:
    """A ready cluster (pinned by tier unless `pins` says otherwise), stopped on exit."""
    pins = tier_cores(num_prefill, num_decode) if pins is None else pins
    base_port, metrics_base_port = free_port_bases(2)  # why not fixed ones: ports.py
    spec = ClusterSpec(
        model_dir,
        num_prefill,
        num_decode,
        base_port,
        metrics_base_port,
        worker_args=engine_flags(engine),
        router_args=router_args,
        env=UCX_ENV,
        pins=pins,
    )
    with Cluster(spec, log_dir=log_dir) as cluster:
        cluster.wait_ready()
        yield cluster


def warm_up(cluster: Cluster) -> None:
    """A few requests through every worker before anything is measured (endpoints, allocator)."""
    workers = len(cluster.prefill) + len(cluster.decode)
    trace = [TraceRequest(0.0, 64, 8)] * (2 * workers)
    run_trace(cluster, trace, Arrivals(0.0), seed="warm-up")


@dataclass(frozen=True)
class Arrivals:
    """When requests start: the load runner's schedule at `rate` (0: all at once)."""

    rate: float
    schedule: LoadSchedule = LoadSchedule.CONST
    seed: int = POISSON_SEED

    def apply(self, lengths: Sequence[TraceRequest]) -> list[TraceRequest]:
        """The requests with the arrival times the load runner will give them."""
        clock = ArrivalSchedule(self.rate, self.schedule, self.seed)
        return [
            dataclasses.replace(request, arrival_s=clock.offset(number) or 0.0)
            for number, request in enumerate(lengths)
        ]


def run_trace(
    cluster: Cluster, trace: Sequence[TraceRequest], arrivals: Arrivals, seed: str
) -> list[Seen]:
    """Streams the trace through the router at `arrivals` (the times `arrivals.apply` gives;
    the trace's own arrival times are not read) and returns what each request saw, in order."""
    config = LoadConfig(
        method=Method.GENERATE_STREAM,
        host=cluster.router.address,
        data=tuple(_call_data(trace, seed)),
        total=len(trace),
        concurrency=len(trace),  # open loop: the load generator never holds a request back
        rps=arrivals.rate,
        load_schedule=arrivals.schedule,
        schedule_seed=arrivals.seed,
        timeout_s=600.0,
        insecure=True,
    )
    results = asyncio.run(drive(config)).results
    by_number = {result.request_number: result for result in results}
    return [_seen(by_number[number]) for number in range(len(trace))]


def _call_data(trace: Sequence[TraceRequest], seed: str) -> list[dict[str, object]]:
    rng = random.Random(f"pdserve-planner/{seed}")
    prefixes: dict[int, list[int]] = {}
    data = []
    for request in trace:
        prompt = _shared_prefix(request, prefixes, rng)
        prompt += _ids(rng, request.prompt_tokens - len(prompt))
        sampling = {"max_tokens": request.output_tokens, "temperature": 0, "ignore_eos": True}
        data.append({"prompt_token_ids": {"ids": prompt}, "sampling": sampling})
    return data


def _shared_prefix(
    request: TraceRequest, prefixes: dict[int, list[int]], rng: random.Random
) -> list[int]:
    """The request's shared prefix (drawn the first time its group appears), or nothing."""
    if request.prefix_id is None:
        return []
    if request.prefix_id not in prefixes:
        prefixes[request.prefix_id] = _ids(rng, request.prefix_tokens)
    return list(prefixes[request.prefix_id])


def _ids(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(FIRST_ID, VOCAB) for _ in range(count)]


def _seen(result: CallResult) -> Seen:
    ttft = None if result.first_token_ns is None else result.first_token_ns / 1e9
    gaps = tuple(gap / 1e9 for gap in result.token_gaps_ns)
    return Seen(ttft, gaps, result.output_tokens, result.ok)


@contextlib.contextmanager
def log_folder(kept: Path | None, purpose: str) -> Iterator[Path]:
    """Where a run's worker logs go: `kept` when the user named one (left in place), else a
    temporary folder removed when the run ends."""
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
        yield kept
        return
    with tempfile.TemporaryDirectory(prefix=f"pdserve-{purpose}-") as temporary:
        yield Path(temporary)
