"""Measures this engine on this device: step times of prefill, decode and mixed batches, swap and
KV-transfer copies per block. The numbers feed `profile.fit`.

Steps are timed around `LLMEngine.step()` as a whole (schedule, forward, sampling, detokenize):
that is what a worker's engine thread pays per step. Each time is paired with what the step ran
(`LLMEngine.last_step_shape`, the shape serving workers time their steps by too).
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.scheduler import SchedulerOutput
from pdserve.core.transfer.interface import TOKEN_NBYTES
from pdserve.core.transfer.staging import Staging, block_index
from pdserve.costmodel.host import this_host
from pdserve.costmodel.profile import (
    BlockCosts,
    Profile,
    StepSample,
    contention_of,
    fit,
)

# Loopback wire bandwidth for KV transfers, bytes/s: docs/transfer.md measured 46 MB in 17-95 ms
# on the wire (0.5-2.7 GB/s) on this 2-core box; 1 GB/s sits inside that range. Timing the wire
# would need two UCX processes, and on this machine it is the smallest part of a transfer.
WIRE_BYTES_PER_S = 1.0e9
FIRST_ID = 100  # random prompt ids skip the special tokens


@dataclass(frozen=True)
class Arrival:
    """A request joining the run before step number `step`."""

    step: int
    prompt_tokens: int
    output_tokens: int


def scenarios(rng: random.Random) -> dict[str, list[Arrival]]:
    """Prefill-only batches (one step each, chunked when over the budget), decode batches of 1-32
    sequences at short and long contexts, and a mixed run with prompts joining running decodes."""
    runs: dict[str, list[Arrival]] = {}
    for length in (16, 64, 128, 256, 512, 1000):
        for count in (1, 4):
            runs[f"prefill {count}x{length}"] = [Arrival(0, length, 1)] * count
    for count in (1, 4, 8, 16, 32):
        for length in (32, 256):
            runs[f"decode {count}x{length}"] = [Arrival(0, length, 8)] * count
    runs["mixed"] = [Arrival(0, rng.randint(10, 100), rng.randint(20, 60)) for _ in range(6)] + [
        Arrival(3 * i, rng.randint(10, 300), rng.randint(10, 60)) for i in range(1, 16)
    ]
    return runs


def run_scenario(
    engine: LLMEngine, name: str, arrivals: list[Arrival], rng: random.Random
) -> list[StepSample]:
    samples: list[StepSample] = []
    pending = sorted(arrivals, key=lambda a: a.step)
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0].step <= step:
            arrival = pending.pop(0)
            prompt = [rng.randrange(FIRST_ID, 49152) for _ in range(arrival.prompt_tokens)]
            params = SamplingParams(
                max_tokens=arrival.output_tokens, temperature=0.0, ignore_eos=True
            )
            engine.add_request(prompt, params)
        started, cpu_started = time.perf_counter(), time.thread_time()
        engine.step()
        seconds, cpu_seconds = time.perf_counter() - started, time.thread_time() - cpu_started
        shape = engine.last_step_shape  # None: the step swapped (priced per block, apart)
        if shape is not None:
            samples.append(StepSample(name, shape, seconds, cpu_seconds))
        step += 1
    return samples


def measure_blocks(engine: LLMEngine, repeats: int = 5, count: int = 32) -> BlockCosts:
    """Median seconds per block of swap-out, staging gather and scatter, `count` blocks at once."""
    ids = list(range(count))
    swap = SchedulerOutput({}, tuple(zip(ids, ids, strict=True)), (), ())
    piece = Staging(engine.layout, count).pieces[0]  # one piece: the whole prompt's message
    cache = engine.runner.kv_cache
    index = block_index(cache, ids)
    token = bytes(TOKEN_NBYTES)
    return BlockCosts(
        block_nbytes=int(engine.layout.block_nbytes),
        swap_s=_median_per_block(lambda: engine.runner.execute(swap, {}), repeats, count),
        gather_s=_median_per_block(lambda: piece.gather_from(cache, index, token), repeats, count),
        scatter_s=_median_per_block(lambda: piece.scatter_into(cache, index), repeats, count),
        wire_bytes_per_s=WIRE_BYTES_PER_S,
    )


def _median_per_block(action: Callable[[], object], repeats: int, count: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) / count


def pin_to(cpu: int) -> None:
    """One core, one torch thread: how the validation pins each worker."""
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)


def measure(model_dir: Path, config: EngineConfig, repeats: int, seed: int = 0) -> Profile:
    engine = LLMEngine(model_dir, config)
    rng = random.Random(seed)
    runs = scenarios(rng)
    run_scenario(engine, "warm-up", runs["mixed"][:4], rng)  # first steps pay one-off costs
    samples: list[StepSample] = []
    for _ in range(repeats):
        for name, arrivals in runs.items():
            samples.extend(run_scenario(engine, name, arrivals, rng))
    environment = {
        "device": config.device,
        "device_name": _device_name(config.device),
        "dtype": config.dtype,
        "model": model_dir.name,
        "torch": torch.__version__,
        "torch_threads": str(torch.get_num_threads()),
        "cpus": ",".join(str(c) for c in sorted(os.sched_getaffinity(0))),
        "loadavg": Path("/proc/loadavg").read_text().strip(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    cpu_clock = config.device == "cpu"
    return Profile(
        fit(samples, cpu_clock),
        measure_blocks(engine),
        config.block_size,
        environment,
        tuple(samples),
        contention_of(samples) if cpu_clock else 1.0,
        host=this_host(),
    )


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return str(torch.cuda.get_device_name(torch.device(device)))
    return platform.processor() or platform.machine()
