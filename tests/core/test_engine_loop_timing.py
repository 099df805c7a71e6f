"""The engine loop times its steps (a stub engine, no model): Load's `step_running_seconds` grows
while a step runs and is 0 between steps; a finished step is recorded by what it ran. A prompt
sent during a step counts as queued until its command has run."""

from __future__ import annotations

import threading
import time
from typing import cast

from pdserve.core.engine import LLMEngine
from pdserve.core.serving.engine_loop import EngineLoop
from pdserve.costmodel.correction import StepPhase
from pdserve.costmodel.step_shape import StepShape


class OneSlowStep:
    """One step of two decodes that runs until the test releases it."""

    def __init__(self) -> None:
        self.requests: dict[str, object] = {}
        self.release = threading.Event()
        self.stepping = threading.Event()
        self.stepped = False
        self.last_step_shape: StepShape | None = None

    def has_unfinished(self) -> bool:
        return not self.stepped

    def step(self) -> list[object]:
        self.stepping.set()
        self.release.wait(timeout=10)
        self.last_step_shape, self.stepped = StepShape.decodes(2, 40), True
        return []


def test_a_running_step_is_timed_and_a_finished_one_recorded() -> None:
    engine = OneSlowStep()
    loop = EngineLoop(cast(LLMEngine, engine))
    assert loop.step_running_seconds() == 0.0
    loop.start()
    try:
        assert engine.stepping.wait(timeout=5)
        time.sleep(0.2)
        assert loop.step_running_seconds() >= 0.2
        engine.release.set()
        deadline = time.monotonic() + 5
        while not loop.steps.windows and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loop.step_running_seconds() == 0.0
        (window,) = loop.steps.windows
        assert (window.phase, window.steps, window.work) == (
            StepPhase.DECODE,
            1,
            StepShape.decodes(2, 40),
        )
        assert window.seconds >= 0.2
    finally:
        loop.stop()


def test_a_prompt_sent_during_a_step_counts_until_its_command_runs() -> None:
    """A Prefill accepted while a long step runs is in no engine queue until the step ends: the
    loop counts it (Load adds it), then, once its command ran, no more."""
    engine = OneSlowStep()
    loop = EngineLoop(cast(LLMEngine, engine))
    loop.start()
    try:
        assert engine.stepping.wait(timeout=5)
        added = loop.call(lambda: "added", prompt_tokens=700)
        no_prompt = loop.call(lambda: "aborted")
        assert loop.queued_prompts() == (1, 700)
        engine.release.set()
        assert added.result(timeout=5) == "added" and no_prompt.result(timeout=5) == "aborted"
        assert loop.queued_prompts() == (0, 0)
    finally:
        loop.stop()
