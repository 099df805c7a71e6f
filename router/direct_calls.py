"""The per-request relay's decode calls (`--relay per-request`): one Decode.Generate or
GenerateLocal call per request, kept by decode worker, so that a worker the router gives up
(a wedged engine: its gRPC server answers, its streams do not move) fails its calls over as the
multiplexed relay fails its stream over (`DecodeMultiplexer.lose`): each ends UNAVAILABLE, which
the dispatcher migrates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from pdserve.router.decode_mux import rpc_error
from pdserve.router.worker import Worker
from pdserve.v1 import decode_pb2

if TYPE_CHECKING:
    from pdserve.v1.decode_pb2_grpc import DecodeAsyncStub

DecodeCall = grpc.aio.UnaryStreamCall[Any, decode_pb2.TokenDelta]  # Generate or GenerateLocal


class DirectRun:
    """One request's own decode call, iterated and cancelled as the call is; `lose` ends it
    UNAVAILABLE with the reason, whatever the worker does."""

    def __init__(self, call: DecodeCall, on_end: Callable[[DirectRun], None]) -> None:
        self._call = call
        self._deltas = call.__aiter__()
        self._on_end = on_end
        self._lost: str | None = None

    def __aiter__(self) -> DirectRun:
        return self

    async def __anext__(self) -> decode_pb2.TokenDelta:
        if self._lost is not None:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, self._lost)
        try:
            delta: decode_pb2.TokenDelta = await self._deltas.__anext__()
        except asyncio.CancelledError:
            if self._lost is None:
                raise
            # `lose` cancelled the call under this wait: the request moves, the task goes on.
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, self._lost) from None
        except BaseException:
            self._on_end(self)
            raise
        return delta

    def cancel(self) -> None:
        self._call.cancel()
        self._on_end(self)

    def lose(self, reason: str) -> None:
        self._lost = reason
        self._call.cancel()


class DirectCalls:
    """The per-request calls open now, by decode worker address."""

    def __init__(self) -> None:
        self._runs: dict[str, set[DirectRun]] = {}

    def start(
        self, worker: Worker[DecodeAsyncStub], make_call: Callable[[], DecodeCall]
    ) -> DirectRun:
        runs = self._runs.setdefault(worker.address, set())
        run = DirectRun(make_call(), runs.discard)
        runs.add(run)
        return run

    def lose(self, worker: Worker[DecodeAsyncStub]) -> None:
        """Fails every call open on `worker` over to other workers (a wedged engine)."""
        reason = f"decode worker {worker.address}: engine wedged (one step too long)"
        for run in list(self._runs.get(worker.address, ())):
            run.lose(reason)
