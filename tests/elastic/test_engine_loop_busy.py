"""A drain waits for commands accepted but not yet run on the engine thread: a Prefill accepted
just before SIGTERM is in no engine queue until its command has run (no model; a stub engine)."""

from __future__ import annotations

from typing import cast

from pdserve.core.engine import LLMEngine
from pdserve.core.serving.engine_loop import EngineLoop


class IdleEngine:
    """Nothing in flight, ever: only the loop's own queue can make it busy."""

    def __init__(self) -> None:
        self.requests: dict[str, object] = {}

    def has_unfinished(self) -> bool:
        return False


def test_a_queued_command_keeps_the_loop_busy_until_it_has_run() -> None:
    loop = EngineLoop(cast(LLMEngine, IdleEngine()))
    assert not loop.busy()
    done = loop.call(lambda: "submitted")  # the thread is not started: the command waits
    assert loop.busy()
    loop.start()
    try:
        assert done.result(timeout=5) == "submitted"
        assert not loop.busy()
        failed = loop.call(lambda: 1 // 0)  # a command that raises still counts out
        assert isinstance(failed.exception(timeout=5), ZeroDivisionError)
        assert not loop.busy()
    finally:
        loop.stop()
