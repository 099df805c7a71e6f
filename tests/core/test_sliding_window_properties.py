"""Property tests of sliding-window paging: random traffic and windows on small pools.

Every invariant of the scheduler's property test holds with a window (sim.py's fake KV memory
checks that each query finds its own KV at every position its window can see, so a block freed
too early, swapped wrongly or taken from the cache with the wrong prefix fails the step), and on
top of it the window's own promise: a sequence never holds more blocks than its window needs.
Between steps that is `max_live_blocks` (ceil(W / block_size) + 1); during a step a chunk of n
tokens also needs the blocks its later queries write, so at most the blocks that W - 1 + n
consecutive positions span. Nothing leaks: every block's ref count is its owners' after every
step, and everything is free at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import event, given
from hypothesis import strategies as st

from pdserve.core.config import EngineConfig
from pdserve.core.kv.sliding_window import live_blocks, max_live_blocks
from pdserve.core.sched.scheduler import Scheduler, SchedulerOutput
from pdserve.core.spec.speculator import Speculator
from tests.core.sim import Arrival, Chunk, FakeRunner, ScriptedProposer, Simulation, StepRecord
from tests.core.test_scheduler_properties import SETTINGS, run_checked, scenarios


class WindowRunner(FakeRunner):
    """Checks, as the forward starts, that no scheduled sequence holds more than its chunk's
    window needs."""

    def __init__(self, config: EngineConfig, sliding_window: int) -> None:
        super().__init__(config, sliding_window)
        self.window = sliding_window

    def execute(self, output: SchedulerOutput, chunks: Sequence[Chunk]) -> None:
        for chunk in chunks:
            held = len(live_blocks(chunk.request.block_ids))
            span = max_live_blocks(self.window, self.block_size, chunk.num_new)
            assert held <= span, f"{chunk.request.request_id} holds {held} blocks, needs {span}"
        super().execute(output, chunks)


class WindowSimulation(Simulation):
    def __init__(
        self,
        config: EngineConfig,
        arrivals: Sequence[Arrival],
        window: int,
        speculator: Speculator | None = None,
    ) -> None:
        super().__init__(config, arrivals, Scheduler, speculator, sliding_window=window)
        self.runner = WindowRunner(config, window)
        self.window = window

    def step(self) -> StepRecord:
        record = super().step()
        bound = max_live_blocks(self.window, self.config.block_size)
        for request in self.scheduler.running + self.scheduler.swapped:
            held = len(live_blocks(request.block_ids)) + len(request.swap_block_ids)
            assert held <= bound, f"{request.request_id} holds {held} blocks between steps"
        return record


def _label(sim: WindowSimulation) -> None:
    if sim.scheduler.kv_manager.num_window_freed_blocks:
        event("slid")


@SETTINGS
@given(scenarios(), st.integers(1, 12))
def test_a_windowed_sequence_holds_what_its_window_needs_and_nothing_leaks(
    scenario: tuple[EngineConfig, list[Arrival]], window: int
) -> None:
    config, arrivals = scenario
    sim = WindowSimulation(config, arrivals, window)
    run_checked(sim)
    _label(sim)


@SETTINGS
@given(scenarios(), st.integers(1, 12), st.integers(1, 5), st.integers(0, 2**16))
def test_a_windowed_sequence_with_drafts_holds_its_window_and_nothing_leaks(
    scenario: tuple[EngineConfig, list[Arrival]],
    window: int,
    num_speculative_tokens: int,
    seed: int,
) -> None:
    """Rolled-back drafts move the window back with the verified count: what slid out stays
    out of every later query's window, and the blocks only rejected drafts used go back."""
    config, arrivals = scenario
    speculator = Speculator(ScriptedProposer(seed), num_speculative_tokens)
    sim = WindowSimulation(config, arrivals, window, speculator)
    run_checked(sim)
    _label(sim)
