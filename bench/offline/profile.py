"""Where a step of pdserve's engine spends its time: timers around its parts, no core changes.

The engine's own functions are wrapped on the instances (and on the names
`pdserve.core.model.forward` and `pdserve.core.model_runner` import), for one run over a workload,
then restored. Each `perf_counter` pair costs well under a microsecond; a step makes a few
hundred of them.

Parts: scheduler (`Scheduler.schedule`), batch building (`ModelRunner._build_batch`, Python
lists -> tensors), the model forward split into matmuls (every `F.linear`, lm_head included),
attention (decode / prefill kernels), KV writes, rotary, RMS norm and the rest of the forward
(embedding, SiLU*up, residual adds, views and the Python of the layer loop), sampling, and the
engine's bookkeeping after the forward (appending tokens, stop checks, detokenizing).

The forward's parts also count what they must move and compute (bench/offline/part_costs.py),
from their arguments, outside their timers: the seconds spent counting are kept apart
(`accounting`) and left out of every part and of the step.

The parts are timed on the per-op path: a decode step's layers in one C++ call
(kernels/decode_step.py) have no Python between its parts to time, so the profile turns it off
and breaks down the same kernels called one by one. `bench offline --batch1-decode` times the
step as the engine runs it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pdserve.core.model.forward as model_module
import pdserve.core.model_runner as runner_module
from pdserve.bench.offline import part_costs
from pdserve.bench.offline.part_costs import Work
from pdserve.core.llm import LLM

FORWARD_PARTS = (
    "linear",
    "attention_decode",
    "attention_prefill",
    "write_kv",
    "rotary",
    "rms_norm",
)


@dataclass
class StepRecord:
    """The time of each part in one engine step."""

    num_seqs: int = 0
    num_sampled: int = 0
    has_prefill: bool = False
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    flops: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class StepTimers:
    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.current = StepRecord()

    def wrap(
        self,
        name: str,
        function: Callable[..., Any],
        work: Callable[..., Work] | None = None,
    ) -> Callable[..., Any]:
        """Times every call of `function` as part `name`; `work(*args, **kwargs)` counts what
        the call must move and compute."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            record = self.current
            if work is not None:
                counting = time.perf_counter()
                done = work(*args, **kwargs)
                record.bytes[name] += done.bytes
                record.flops[name] += done.flops
                record.seconds["accounting"] += time.perf_counter() - counting
            start = time.perf_counter()
            result = function(*args, **kwargs)
            record.seconds[name] += time.perf_counter() - start
            return result

        return timed

    def timed_step(self, step: Callable[[], Any]) -> Callable[[], Any]:
        def timed() -> Any:
            self.current = StepRecord()
            start = time.perf_counter()
            result = step()
            self.current.seconds["step"] = time.perf_counter() - start
            self.current.num_sampled = len(result)
            self.steps.append(self.current)
            return result

        return timed

    def note_batch(self, build: Callable[..., Any]) -> Callable[..., Any]:
        timed_build = self.wrap("build_batch", build)

        def noted(chunks: list[Any]) -> Any:
            batch = timed_build(chunks)
            self.current.num_seqs = len(chunks)
            self.current.has_prefill = batch.prefill is not None
            return batch

        return noted


@contextmanager
def instrumented(llm: LLM) -> Iterator[StepTimers]:
    """Wraps the engine's parts for the duration of the block, then puts everything back."""
    timers = StepTimers()
    engine, runner = llm.engine, llm.engine.runner
    model = runner.model
    instance_patches: list[tuple[object, str, Callable[..., Any]]] = [
        (engine, "step", timers.timed_step(engine.step)),
        (engine.scheduler, "schedule", timers.wrap("schedule", engine.scheduler.schedule)),
        (runner, "execute", timers.wrap("execute", runner.execute)),
        (runner, "_build_batch", timers.note_batch(runner._build_batch)),
        (model, "forward", timers.wrap("forward", model.forward)),
    ]
    module_patches: list[tuple[ModuleType, str, object]] = [
        *(
            (module, name, timers.wrap(label, getattr(module, name), work))
            for module, name, label, work in (
                (model_module, "linear", "linear", part_costs.linear_work),
                (model_module, "write_kv", "write_kv", _write_kv_work),
                (model_module, "add_rms_norm", "rms_norm", part_costs.add_rms_norm_work),
                (model_module, "apply_rotary", "rotary", part_costs.rotary_work),
                (model_module, "run_planned_decode", "attention_decode", _decode_work),
                (model_module, "paged_attention_prefill", "attention_prefill", _prefill_work),
                (runner_module, "sample", "sample", None),
            )
        ),
    ]
    originals = [(module, name, getattr(module, name)) for module, name, _ in module_patches]
    for target, name, replacement in [*instance_patches, *module_patches]:
        setattr(target, name, replacement)
    in_one_call, model.decode_layers = model.decode_layers, None  # the module docstring says why
    try:
        yield timers
    finally:
        model.decode_layers = in_one_call
        for target, name, _ in instance_patches:
            delattr(target, name)  # the class's method shows through again
        for module, name, original in originals:
            setattr(module, name, original)


# The wrapped functions' signatures, mapped onto what part_costs needs of them.


def _write_kv_work(k: Any, v: Any, k_cache: Any, *_: Any, **__: Any) -> Work:
    return part_costs.write_kv_work(k, v, k_cache)


def _decode_work(q: Any, k_cache: Any, _v_cache: Any, plan: Any, *_: Any, **__: Any) -> Work:
    return part_costs.decode_attention_work(q, k_cache, plan)


def _prefill_work(
    q: Any,
    k_cache: Any,
    _v_cache: Any,
    _block_tables: Any,
    query_start_loc: Any,
    context_lens: Any,
    _scale: float,
    sliding_window: int | None = None,
) -> Work:
    return part_costs.prefill_attention_work(
        q, k_cache, query_start_loc, context_lens, sliding_window
    )
