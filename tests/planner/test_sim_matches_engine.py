"""The simulated worker and the real engine make the same scheduling decisions on one trace.

The real `LLMEngine` (real model, small cache so that chunking, preemption and swap all happen)
runs a trace of arrivals given as step numbers and records every plan its scheduler makes. The
simulator runs the same trace with a fixed step time of one second, each arrival half a second
before the step it joins, and records its worker's plans: they must be equal, step for step
(which requests run, how many tokens each, every swap-out and swap-in pair, every preemption).
"""

from __future__ import annotations

import random
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.scheduler import Scheduler, SchedulerOutput
from pdserve.planner.sim_cluster import ClusterSim, Deployment
from pdserve.planner.workload import TraceRequest
from tests.planner.helpers import fixed_step_profile

CONFIG = EngineConfig(
    num_kv_blocks=14, num_swap_blocks=6, max_num_seqs=4, max_num_batched_tokens=48
)


class RecordingScheduler(Scheduler):
    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.outputs: list[SchedulerOutput] = []

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        self.outputs.append(output)
        return output


def _trace() -> list[tuple[int, int, int]]:
    """(arrival step, prompt tokens, output tokens), in arrival order."""
    rng = random.Random(3)
    return [(2 * i + rng.randint(0, 1), rng.randint(10, 60), rng.randint(5, 30)) for i in range(10)]


def _real_outputs(model_dir: Path) -> list[SchedulerOutput]:
    engine = LLMEngine(model_dir, CONFIG, scheduler_class=RecordingScheduler)
    trace = _trace()
    step = 0
    while step <= trace[-1][0] or engine.has_unfinished():
        for index, (arrival, prompt, output) in enumerate(trace):
            if arrival == step:
                params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
                engine.add_request([100 + index] * prompt, params, request_id=str(index))
        if engine.has_unfinished():
            engine.step()
        step += 1
    scheduler = engine.scheduler
    assert isinstance(scheduler, RecordingScheduler)
    return [output for output in scheduler.outputs if not output.is_empty]


def _simulated_outputs() -> list[SchedulerOutput]:
    requests = [
        TraceRequest(max(arrival - 0.5, 0.0), prompt, output)
        for arrival, prompt, output in _trace()
    ]
    sim = ClusterSim(Deployment(0, 1, decode_config=CONFIG), fixed_step_profile(1.0))
    worker = sim.decode[0]
    worker.record_outputs = True
    sim.run(requests)
    return worker.outputs


def test_simulated_scheduler_decides_like_the_real_engine(model_dir: Path) -> None:
    simulated = _simulated_outputs()
    assert any(output.swap_out for output in simulated), "the trace must exercise swap"
    assert any(output.preempted_ids for output in simulated)
    real = _real_outputs(model_dir)
    assert len(simulated) == len(real)
    for step, (sim_output, real_output) in enumerate(zip(simulated, real, strict=True)):
        assert sim_output == real_output, f"step {step} differs"
