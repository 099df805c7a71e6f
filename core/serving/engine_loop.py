"""Runs an engine on its own thread and connects it to asyncio servicers.

The engine is not thread-safe, so every change to it (add, abort, reserve, ...) is a command run on
the engine thread between steps (`call`). Deltas go to per-request sinks, which servicers usually
make with `loop.call_soon_threadsafe`. If a step raises, every in-flight request gets the error
(its sink receives the exception) and the loop keeps serving new requests: one bad step must not
take the worker down. A request may instead join a `StepGroup` (the decode tier's Multiplex
stream): the group gets every item of a step, then one `flush`, so that one hand-over to asyncio
(and one message to the router) carries the step's tokens of all its requests.

Each step is timed from its start to its tokens handed over and recorded by what it ran (`steps`,
costmodel/correction.py): the worker's Load reports those windows, and cost models correct their
predictions for this worker by them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

from pdserve.core.engine import LLMEngine
from pdserve.core.outputs import TokenDelta
from pdserve.costmodel.correction import StepRecorder

T = TypeVar("T")
Sink = Callable[[TokenDelta | BaseException], None]

log = logging.getLogger(__name__)


class StepGroup(Protocol):
    """Requests whose deltas are handed over together, once per step (engine thread only)."""

    def add(self, request_id: str, item: TokenDelta | BaseException) -> None: ...

    def flush(self) -> None:
        """The step (or the background poll, or a failure) has delivered all it had."""
        ...


class BackgroundWork(Protocol):
    """Work the loop polls between steps (the decode tier's incoming KV transfers)."""

    def pending(self) -> bool: ...

    def poll(self) -> list[tuple[str, TokenDelta | BaseException]]:
        """Advances the work; returns what to deliver to request sinks."""
        ...


class EngineLoop:
    def __init__(
        self,
        engine: LLMEngine,
        background: BackgroundWork | None = None,
        poll_interval_s: float = 0.001,
    ) -> None:
        self.engine = engine
        self._background = background
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # Commands not yet run: a drain must wait for them too (a Prefill accepted just before
        # SIGTERM is in no engine queue until its command has run).
        self._queued = 0
        # Of those, the prompts they add and their tokens to compute: the worker's Load counts
        # them (`queued_prompts`), or a prompt sent during a long step is in no report until
        # the step ends, and the router, its own count reset by that report, sees none of it.
        self._queued_prompts = 0
        self._queued_prompt_tokens = 0
        self._queued_lock = threading.Lock()
        self._sinks: dict[str, Sink] = {}
        self._groups: dict[str, StepGroup] = {}
        self._touched: dict[int, StepGroup] = {}  # groups given items since their last flush
        self._poll_interval_s = poll_interval_s
        self.steps = StepRecorder()  # this worker's recent steps, timed
        self._step_started: float | None = None  # perf_counter of the step running now
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pdserve-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._commands.put(lambda: None)  # wakes the loop if it sleeps on the queue
        self._thread.join(timeout=10)

    def call(
        self, command: Callable[[], T], prompt_tokens: int = 0
    ) -> concurrent.futures.Future[T]:
        """Runs `command` on the engine thread between steps; its result or error in the future.
        `prompt_tokens`: the prompt tokens it adds for the engine to compute (0: no prompt)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        prompts = 1 if prompt_tokens else 0

        def run() -> None:
            result: T | None = None
            error: BaseException | None = None
            runs = future.set_running_or_notify_cancel()
            try:
                if runs:
                    result = command()
            except BaseException as failure:  # the caller gets it
                error = failure
            finally:  # counted out before the caller hears: its prompt is in the engine's queue
                self._count_queued(-1, -prompts, -prompt_tokens)
            if not runs:
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(cast(T, result))

        self._count_queued(+1, prompts, prompt_tokens)
        self._commands.put(run)
        return future

    def _count_queued(self, commands: int, prompts: int, prompt_tokens: int) -> None:
        with self._queued_lock:
            self._queued += commands
            self._queued_prompts += prompts
            self._queued_prompt_tokens += prompt_tokens

    def queued_prompts(self) -> tuple[int, int]:
        """Prompts in commands not yet run, and their tokens (read from any thread)."""
        with self._queued_lock:
            return self._queued_prompts, self._queued_prompt_tokens

    def subscribe(self, request_id: str, sink: Sink) -> None:
        """Routes the request's deltas to `sink` (call from the engine thread, e.g. in `call`)."""
        self._sinks[request_id] = sink

    def join(self, request_id: str, group: StepGroup) -> None:
        """Routes the request's deltas to `group` (engine thread, like `subscribe`)."""
        self._groups[request_id] = group

    def unsubscribe(self, request_id: str) -> None:
        self._sinks.pop(request_id, None)
        self._groups.pop(request_id, None)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._run_commands(self._command_wait())
            if self._background is not None:
                for request_id, item in self._background.poll():
                    self._deliver(request_id, item)
                self._flush_groups()
            if self.engine.has_unfinished():
                started = self._step_started = time.perf_counter()
                stepped = self._step()
                self._flush_groups()
                self._step_started = None
                shape = self.engine.last_step_shape
                if stepped and shape is not None:
                    self.steps.record(shape, time.perf_counter() - started)

    def step_running_seconds(self) -> float:
        """How long the step running now has run (0: none is); read from any thread."""
        started = self._step_started
        return 0.0 if started is None else time.perf_counter() - started

    def busy(self) -> bool:
        """Whether any request is still in flight here (for draining)."""
        background = self._background is not None and self._background.pending()
        subscribed = bool(self._sinks) or bool(self._groups)
        return background or self._queued > 0 or self.engine.has_unfinished() or subscribed

    def _command_wait(self) -> float | None:
        """How long to wait for a command: not at all while the engine has work, briefly while
        background work (transfers) must be polled, else until one comes."""
        if self.engine.has_unfinished():
            return 0.0
        if self._background is not None and self._background.pending():
            return self._poll_interval_s
        return None

    def _run_commands(self, wait: float | None) -> None:
        try:
            if wait == 0.0:
                command = self._commands.get_nowait()
            else:
                command = self._commands.get(timeout=wait)
        except queue.Empty:
            return
        command()
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()

    def _step(self) -> bool:
        """One engine step and its deliveries; False if it failed."""
        try:
            deltas = self.engine.step()
        except Exception as error:  # reported to every request; the loop survives
            log.exception("engine step failed; failing every in-flight request")
            self._fail_all(error)
            return False
        for delta in deltas:
            self._deliver(delta.request_id, delta)
        return True

    def _deliver(self, request_id: str, item: TokenDelta | BaseException) -> None:
        last = isinstance(item, BaseException) or item.finished
        group = self._groups.get(request_id)
        if group is not None:
            group.add(request_id, item)
            self._touched[id(group)] = group
            if last:
                del self._groups[request_id]
            return
        sink = self._sinks.get(request_id)
        if sink is not None:
            sink(item)
        if last:
            self._sinks.pop(request_id, None)

    def _flush_groups(self) -> None:
        touched, self._touched = self._touched, {}
        for group in touched.values():
            group.flush()

    def _fail_all(self, error: Exception) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
            self._deliver(request_id, error)
        self._flush_groups()
