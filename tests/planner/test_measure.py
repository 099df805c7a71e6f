"""`pdserve profile`'s offline run pairs each timed step with what it ran (the engine's own
`last_step_shape`, which serving workers time their steps by too)."""

from __future__ import annotations

import random
from pathlib import Path

from pdserve.core.config import EngineConfig
from pdserve.core.engine import LLMEngine
from pdserve.costmodel.step_shape import StepShape
from pdserve.planner.measure import Arrival, run_scenario


def test_every_step_is_timed_with_its_shape(model_dir: Path) -> None:
    engine = LLMEngine(model_dir, EngineConfig(num_kv_blocks=64, num_swap_blocks=0))
    samples = run_scenario(engine, "decode 4x32", [Arrival(0, 32, 4)] * 4, random.Random(1))
    assert [s.shape for s in samples] == [
        StepShape(prefill_tokens=4 * 32, prefill_pairs=4 * 32 * 32),  # the four prompts
        *(StepShape.decodes(4, 4 * (33 + k)) for k in range(3)),
    ]
    assert all(s.seconds > 0 and s.cpu_seconds > 0 for s in samples)
