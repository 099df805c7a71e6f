"""Drives a ghz-style load: `concurrency` workers share request numbers and, under `rps`, a
schedule of start times (ghz's const load schedule, or Poisson arrivals: a busy worker delays its
slot, it never drops it). The run ends when `total` calls are done, or at `duration` /
`max-duration`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import grpc

from pdserve.client import GenerationClient
from pdserve.loadtest.calldata import RequestMessage, build_messages
from pdserve.loadtest.calls import CallResult, CallSettings, error_result, make_call
from pdserve.loadtest.config import DurationStop, LoadConfig
from pdserve.loadtest.progress import Progress
from pdserve.loadtest.schedule import ArrivalSchedule


class EndReason(Enum):
    """ghz's `endReason`."""

    NORMAL = "normal"
    TIMEOUT = "timeout"
    CANCEL = "cancel"


@dataclass(frozen=True)
class RunOutcome:
    """Every counted call in completion order, and the run's wall time."""

    results: tuple[CallResult, ...]
    total_ns: int
    end_reason: EndReason
    started_at: float  # wall clock


class _Slots:
    """Hands out request numbers in order; under a rate, number i may start at i / rps."""

    def __init__(self, limit: int | None, schedule: ArrivalSchedule) -> None:
        self._limit = limit
        self._schedule = schedule
        self._next = 0
        self._origin = time.perf_counter()
        self._closed = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """No slot starts any more; workers waiting for a later turn wake up at once."""
        self._closed.set()

    def take(self) -> int | None:
        if self.closed or (self._limit is not None and self._next >= self._limit):
            return None
        number, self._next = self._next, self._next + 1
        return number

    async def wait_for_turn(self, number: int) -> None:
        offset = self._schedule.offset(number)
        if offset is not None:
            delay = max(0.0, self._origin + offset - time.perf_counter())
            # Not a plain sleep: at the end of a `duration` run the slots close, and a worker
            # waiting for a turn far in the future must not hold the run open until then.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), timeout=delay)


@dataclass
class _Run:
    config: LoadConfig
    messages: tuple[RequestMessage, ...]
    clients: list[GenerationClient]
    slots: _Slots
    progress: Progress
    results: list[CallResult]

    async def worker(self, index: int) -> None:
        client = self.clients[index % len(self.clients)]
        timeout = self.config.timeout_s or None
        settings = CallSettings(self.config.method, timeout, self.config.metadata)
        while (number := self.slots.take()) is not None:
            await self.slots.wait_for_turn(number)
            if self.slots.closed:
                return
            request = self.messages[number % len(self.messages)]
            await self._one_call(client, number, request, settings)

    async def _one_call(
        self,
        client: GenerationClient,
        number: int,
        request: RequestMessage,
        settings: CallSettings,
    ) -> None:
        self.progress.call_started()
        started_at, started_ns = time.time(), time.perf_counter_ns()
        try:
            result = await make_call(client, request, settings, started_ns)
        except asyncio.CancelledError:
            # Stopped by duration / Ctrl-C: ghz counts the call as Canceled unless told to ignore.
            dropped = self.config.duration_stop is DurationStop.IGNORE
            desc = "run stopped while the call was in flight"
            cancelled = error_result(started_at, started_ns, grpc.StatusCode.CANCELLED, desc)
            self._record(None if dropped else replace(cancelled, request_number=number))
            raise
        self._record(replace(result, request_number=number))

    def _record(self, result: CallResult | None) -> None:
        self.progress.call_finished(result)
        if result is not None:
            self.results.append(result)


def open_channel(config: LoadConfig) -> grpc.aio.Channel:
    """A channel per ghz's connection keys; separate connections get separate subchannels."""
    options: list[tuple[str, str | int]] = []
    if config.connections > 1:
        options.append(("grpc.use_local_subchannel_pool", 1))
    if config.insecure:
        return grpc.aio.insecure_channel(config.host, options=options)
    tls = config.tls
    if tls.cname:
        options.append(("grpc.ssl_target_name_override", tls.cname))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(tls.cacert).read_bytes() if tls.cacert else None,
        private_key=Path(tls.key).read_bytes() if tls.key else None,
        certificate_chain=Path(tls.cert).read_bytes() if tls.cert else None,
    )
    return grpc.aio.secure_channel(config.host, credentials, options=options)


async def drive(
    config: LoadConfig, progress: Progress | None = None, *, interruptible: bool = False
) -> RunOutcome:
    """Run the load described by `config` and return every counted call. `interruptible`: Ctrl-C
    ends the run with the calls so far (EndReason.CANCEL, as ghz reports it), for `pdserve
    loadtest`; otherwise Ctrl-C is left to the program, as a benchmark needs (it ran several
    drives in one loop, and each took Ctrl-C for itself: one phase ended, the others and their
    pods went on)."""
    messages = build_messages(config.method, config.data)
    clients = [GenerationClient(open_channel(config)) for _ in range(config.connections)]
    limit = None if config.duration_s > 0 else config.total
    schedule = ArrivalSchedule(config.rps, config.load_schedule, config.schedule_seed, config.total)
    slots = _Slots(limit, schedule)
    run = _Run(config, messages, clients, slots, progress or Progress(None), [])
    started_at, started_ns = time.time(), time.perf_counter_ns()
    try:
        end_reason = await _run_until_done(run, interruptible)
    finally:
        for client in clients:
            await client.close()
    total_ns = time.perf_counter_ns() - started_ns
    return RunOutcome(tuple(run.results), total_ns, end_reason, started_at)


async def _run_until_done(run: _Run, interruptible: bool) -> EndReason:
    config = run.config
    workers = [asyncio.create_task(run.worker(i)) for i in range(config.concurrency)]
    all_done = asyncio.gather(*workers)
    interrupted = asyncio.Event()
    interrupt_wait = asyncio.create_task(interrupted.wait())
    redraw = asyncio.create_task(run.progress.redraw_forever())
    loop = asyncio.get_running_loop()
    if interruptible:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, interrupted.set)
    deadline = config.duration_s or config.max_duration_s or None
    try:
        stop_signals: set[asyncio.Future[Any]] = {all_done, interrupt_wait}
        await asyncio.wait(stop_signals, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
        if all_done.done():
            all_done.result()  # re-raise a worker's bug, if any
            return EndReason.NORMAL
        reason = EndReason.CANCEL if interrupted.is_set() else EndReason.TIMEOUT
        await _stop(run, workers, wait=reason is EndReason.TIMEOUT and _waits(config))
        return reason
    finally:
        if interruptible:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
        for task in (interrupt_wait, redraw):
            task.cancel()
        run.progress.finish()


def _waits(config: LoadConfig) -> bool:
    return config.duration_stop is DurationStop.WAIT


async def _stop(run: _Run, workers: list[asyncio.Task[None]], *, wait: bool) -> None:
    run.slots.close()
    if not wait:
        for task in workers:
            task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
