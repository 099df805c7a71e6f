"""Glue between a grpc.aio servicer and an engine running on its EngineLoop thread."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import faulthandler
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from pdserve.core.engine import LLMEngine
from pdserve.core.errors import DrainingError, NotServedHereError
from pdserve.core.outputs import TokenDelta
from pdserve.core.serving.cli_config import (
    add_engine_arguments,
    add_flag,
    add_model_arguments,
    add_server_arguments,
    add_ucx_arguments,
    configure_logging,
    server_config_from_args,
)
from pdserve.core.serving.engine_loop import EngineLoop
from pdserve.core.serving.proto_convert import load_to_proto
from pdserve.core.serving.server import ServiceHost
from pdserve.core.structured.params import StructuredOutputsParams
from pdserve.v1 import common_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")
EXIT_WATCHDOG_S = 10.0  # from the server's stop to the process's end
EngineT = TypeVar("EngineT", bound=LLMEngine)


class TierRuntime:
    """Set once the model is loaded; servicers exist earlier (grpc.aio needs them before start)."""

    def __init__(self, host: ServiceHost) -> None:
        self.host = host
        self.loop: EngineLoop | None = None

    def engine_loop(self) -> EngineLoop:
        if self.loop is None:
            raise DrainingError("this worker is still loading its model")
        return self.loop

    def engine(self, kind: type[EngineT]) -> EngineT:
        """The loaded engine, as the tier's own engine class."""
        engine = self.engine_loop().engine
        if not isinstance(engine, kind):
            raise NotServedHereError(
                f"this call needs a {kind.__name__}; this worker runs a {type(engine).__name__}"
            )
        return engine

    def check_accepting(self) -> None:
        """New work (not the rest of work already accepted) is refused while draining."""
        if self.host.draining:
            raise DrainingError("this worker is draining; retry on another")

    def load_reply(self) -> common_pb2.LoadResponse:
        """This worker's `Load` answer (both tiers answer the same way)."""
        loop = self.engine_loop()
        prompts, prompt_tokens = loop.queued_prompts()
        load = loop.engine.load()
        accepted = dataclasses.replace(
            load,
            num_waiting=load.num_waiting + prompts,
            num_pending_prompt_tokens=load.num_pending_prompt_tokens + prompt_tokens,
        )
        return load_to_proto(
            accepted,
            loop.steps.windows,
            loop.step_running_seconds(),
            self.host.draining,
        )

    def is_idle(self) -> bool:
        loop = self.loop
        return loop is None or not loop.busy()

    async def call(
        self,
        command: Callable[[], T],
        undo: Callable[[], None] | None = None,
        prompt_tokens: int = 0,
    ) -> T:
        """Runs `command` on the engine thread and awaits its result (`prompt_tokens`: of the
        prompt it adds, counted in Load until it runs).

        The command runs even if this caller is cancelled meanwhile (a cancelled or expired RPC
        must not skip an abort, nor leave half-made state behind): `undo`, if given, is then
        queued after it, on the same thread, so it sees what the command made."""
        return await self.wait(self.engine_loop().call(command, prompt_tokens), undo)

    async def wait(
        self, future: concurrent.futures.Future[T], undo: Callable[[], None] | None
    ) -> T:
        """Awaits an engine-side future without ever cancelling it (the engine thread owns it:
        cancelling it from here would race with the engine resolving it); `undo` on cancel.

        A cancelled caller leaves the future to resolve later, with no one to read it: its
        outcome is read then (an error is logged at debug), so that a failure after the cancel
        (a prefill's send that decode, the call gone, never takes: given up 30 s on) is not
        reported as a future whose exception was never retrieved."""
        outcome = asyncio.wrap_future(future)
        try:
            return await asyncio.shield(outcome)
        except asyncio.CancelledError:
            outcome.add_done_callback(_read_after_cancel)
            if undo is not None:
                self.abort_soon(undo)
            raise

    async def compile_grammar(self, structured: StructuredOutputsParams | None) -> None:
        """Compiles a request's structured constraint on the compiler's own threads, so that the
        engine thread finds it compiled (a no-op without one, or once compiled). Raises
        InvalidRequestError naming the field if it does not compile in time."""
        if structured is not None:
            await self.engine(LLMEngine).grammars.prepare(structured)

    def abort_soon(self, abort: Callable[[], None]) -> None:
        """Fire-and-forget cleanup (from finally blocks of cancelled calls)."""
        if self.loop is not None:
            self.loop.call(abort)

    async def stream(
        self, request_id: str, start: Callable[[], None], prompt_tokens: int = 0
    ) -> AsyncIterator[TokenDelta]:
        """Runs `start` on the engine thread, then yields the request's deltas until it finishes
        (`prompt_tokens`: of the prompt `start` adds, as for `call`).

        Raises the error the engine reports for the request. If the caller stops early
        (cancellation, deadline), the request is aborted on the engine."""
        loop = self.engine_loop()
        queue: asyncio.Queue[TokenDelta | BaseException] = asyncio.Queue()
        aio_loop = asyncio.get_running_loop()

        def sink(item: TokenDelta | BaseException) -> None:
            aio_loop.call_soon_threadsafe(queue.put_nowait, item)

        def start_and_subscribe() -> None:
            # In this order, on the engine thread (no step runs between the two): a start the
            # engine refuses (an id it already runs) must not touch the running one's delivery.
            start()
            loop.subscribe(request_id, sink)

        await self.call(
            start_and_subscribe,
            undo=lambda: abort_and_unsubscribe(loop, request_id),
            prompt_tokens=prompt_tokens,
        )
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                loop.call(lambda: abort_and_unsubscribe(loop, request_id))


def abort_and_unsubscribe(loop: EngineLoop, request_id: str) -> None:
    """What a caller that stops waiting leaves behind (engine thread): nothing of the request."""
    loop.unsubscribe(request_id)
    loop.engine.abort(request_id)


async def serve_tier(runtime: TierRuntime, build_loop: Callable[[], EngineLoop]) -> None:
    """Starts serving at once (liveness), loads the model, then turns ready; drains on SIGTERM."""
    host = runtime.host
    await host.start()
    loop = await asyncio.to_thread(build_loop)
    loop.start()
    runtime.loop = loop
    await host.set_ready(True)
    try:
        await host.serve_until_signal(runtime.is_idle)
    finally:
        loop.stop()
        loop.engine.close()


def add_tier_arguments(parser: argparse.ArgumentParser, port: int, metrics_port: int) -> None:
    """The flags both worker tiers take (docs/contract.md)."""
    add_model_arguments(parser)
    add_engine_arguments(parser)
    add_server_arguments(parser, port, metrics_port)
    add_ucx_arguments(parser)
    group = parser.add_argument_group("SLO-aware steps (costmodel/step_budget.py)")
    add_flag(
        group,
        "--itl-slo",
        float,
        None,
        "seconds: a step that decodes takes only the prompt tokens that keep its predicted time "
        "within this (needs --profile; default: off)",
    )
    add_flag(
        group,
        "--itl-slo-mode",
        str,
        "step",
        "what --itl-slo bounds: step (every step's predicted time) or mean (each running "
        "stream's mean gap over its output here: a step may spend the slack it banked and the "
        "slack its remaining tokens will leave)",
        choices=["step", "mean"],
    )
    add_flag(
        group,
        "--profile",
        Path,
        None,
        "`pdserve profile`'s cost model: prices steps for --itl-slo; its predictions and their "
        "correction by the measured steps are exported as step gauges",
    )


def run_tier(
    args: argparse.Namespace,
    service_name: str,
    add_servicer: Callable[[TierRuntime, grpc.aio.Server], None],
    build_loop: Callable[[], EngineLoop],
) -> int:
    """A worker's main: serve `service_name` (also its readiness name) until SIGTERM."""
    role = service_name.rsplit(".", 1)[-1].lower()
    configure_logging(args.log_level, f"%(asctime)s {role} %(levelname)s %(message)s")

    async def serve() -> None:
        # grpc.aio objects must be created inside the running event loop.
        host = ServiceHost(server_config_from_args(args), service_name, [service_name])
        runtime = TierRuntime(host)
        add_servicer(runtime, host.server)
        await serve_tier(runtime, build_loop)

    asyncio.run(serve())
    # What is left runs at the interpreter's exit (threads, finalizers): if that hangs, the
    # threads' stacks go to the log and the process exits anyway, not a supervisor's kill later.
    faulthandler.dump_traceback_later(EXIT_WATCHDOG_S, exit=True)
    return 0


def _read_after_cancel(outcome: asyncio.Future[Any]) -> None:
    if not outcome.cancelled() and outcome.exception() is not None:
        log.debug("an outcome after its call was cancelled: %r", outcome.exception())
