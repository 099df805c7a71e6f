"""One UCX worker per transfer object, driven from one asyncio event-loop thread that it owns.

How the services drive UCX (both engines run a plain Python thread loop; the gRPC servers are
grpc.aio): nobody shares an event loop with UCX. `UcxRuntime` starts

- one daemon thread running a private asyncio loop: every UCX call (endpoint creation, tag send,
  tag receive, close) is made there, so UCX objects are touched by one Python thread only;
- UCX's own progress thread (ucxx, epoll based, no busy spinning);
- ucxx's notifier thread, which completes the asyncio futures of finished UCX requests on that loop.

Callers on any thread use `submit(coroutine)` (returns a `concurrent.futures.Future`, which a
grpc.aio handler can await with `asyncio.wrap_future`) or `call(coroutine)` (waits for it). The
low-level `ucxx._lib.libucxx` API is used instead of ucxx's global `ApplicationContext` so that two
runtimes can live in one process, no global state is set, and every helper thread is a daemon
that cannot keep a process alive if `close()` is forgotten.

Config is passed in (`UcxConfig`); this module never reads the environment. UCX itself still reads
its `UCX_*` variables (`UCX_TLS`, `UCX_NET_DEVICES`, ...), which the service mains and the tests set
before importing ucxx; `UcxConfig.options` overrides them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import ucxx._lib.libucxx as ucx_api
from ucxx._lib.arr import Array
from ucxx._lib_async.notifier_thread import _notifierThread

from pdserve.core.transfer.staging import StagingPlace

T = TypeVar("T")

START_TIMEOUT_S = 30.0
CLOSE_PERIOD_NS = 10**9


@dataclass(frozen=True)
class UcxConfig:
    """How one transfer object sets up UCX.

    options: UCX options without the `UCX_` prefix (e.g. `(("TLS", "tcp"),)`); empty means UCX's
        own environment decides.
    endpoint_error_handling: peer-failure detection on endpoints. UCX's shared-memory transports do
        not support it, so True forces TCP even between processes on one host; use True across
        pods (a dead peer then fails the transfer instead of hanging it).
    send_timeout_s: how long a send may wait for the receiver to take the bytes.
    tcp_syn_retries: SYNs UCX's TCP transport resends before a connect fails (UCX's
        `TCP_SYN_CNT`; None leaves the kernel's default, 6: 127 s). UCX connects on its progress
        thread and nothing else moves meanwhile, so a connect to a pod that vanished without an
        answer stalled every transfer of the worker for two minutes; 2 gives up after 7 s and
        still survives a lost SYN. `options` may set `TCP_SYN_CNT` itself.
    staging_pool_bytes: idle staging memory kept for reuse (see `StagingPool`).
    staging_limit_bytes: staging memory a receiver holds at once for transfers under way; an
        expected transfer past it posts its receives once earlier ones have landed (its sender
        waits meanwhile, within its send timeout). None: no limit (the workers' flag,
        `--kv-staging-limit-mb`, sets one by default).
    progress_polling: UCX's progress thread spins instead of sleeping in epoll: lower latency per
        rendezvous step, one busy core per worker. Off by default (see docs/transfer.md).
    staging: where staging buffers live (`StagingPlace`): host memory (default, any UCX build),
        or the KV cache's device (GPU tiers: UCX's CUDA transports move device memory).
    """

    options: tuple[tuple[str, str], ...] = ()
    endpoint_error_handling: bool = False
    send_timeout_s: float = 30.0
    tcp_syn_retries: int | None = 2
    staging_pool_bytes: int = 256 * 2**20
    staging_limit_bytes: int | None = None
    progress_polling: bool = False
    staging: StagingPlace = StagingPlace.HOST

    def __post_init__(self) -> None:
        if self.send_timeout_s <= 0:
            raise ValueError(f"send_timeout_s: must be > 0, got {self.send_timeout_s}")
        if self.tcp_syn_retries is not None and self.tcp_syn_retries < 1:
            raise ValueError(f"tcp_syn_retries: must be >= 1, got {self.tcp_syn_retries}")
        if self.staging_pool_bytes < 0:
            raise ValueError(f"staging_pool_bytes: must be >= 0, got {self.staging_pool_bytes}")
        if self.staging_limit_bytes is not None and self.staging_limit_bytes <= 0:
            raise ValueError(
                f"staging_limit_bytes: must be > 0 (or None), got {self.staging_limit_bytes}"
            )


class UcxRuntime:
    """A UCX context + worker and the event-loop thread that drives them."""

    def __init__(self, config: UcxConfig) -> None:
        self.config = config
        self._loop = asyncio.new_event_loop()
        self._context = ucx_api.UCXContext(
            _context_options(config), feature_flags=(ucx_api.Feature.TAG, ucx_api.Feature.WAKEUP)
        )
        self.worker = ucx_api.UCXWorker(self._context, enable_python_future=True)
        self.worker.start_progress_thread(polling_mode=config.progress_polling, epoll_timeout=1)
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="pdserve-ucx-loop", daemon=True
        )
        self._loop_thread.start()
        self._notifier_queue: queue.Queue[str] = queue.Queue()
        self._notifier = threading.Thread(
            target=_notifierThread,
            args=(self._loop, self.worker, self._notifier_queue),
            name="pdserve-ucx-notifier",
            daemon=True,
        )
        self._notifier.start()
        self._closed = False

    @property
    def worker_address(self) -> bytes:
        """This worker's UCX address: what a peer needs to open an endpoint to it."""
        return bytes(self.worker.address.tobytes())

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Runs `coroutine` on the UCX loop thread; safe from any thread."""
        if self._closed:
            coroutine.close()
            raise RuntimeError("UcxRuntime is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = START_TIMEOUT_S) -> T:
        """Runs `coroutine` on the UCX loop thread and waits for its result."""
        return self.submit(coroutine).result(timeout=timeout_s)

    def refill_futures(self) -> None:
        """Tops up ucxx's pool of Python futures, on the loop thread, before another thread posts
        requests. When the pool runs dry ucxx makes futures inline on the posting thread, which
        has no event loop: that fails and the process dies (a burst of 64 reservations killed a
        decode worker). The notifier thread refills it too, but only between its waits."""
        self.call(_populate_futures(self.worker))

    def close(self) -> None:
        """Stops the notifier, progress and loop threads (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._notifier_queue.put("shutdown")
        self.worker.stop_request_notifier_thread()
        self._notifier.join(timeout=5.0)
        self.worker.stop_progress_thread()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=5.0)


def _context_options(config: UcxConfig) -> dict[str, str]:
    defaults = {}
    if config.tcp_syn_retries is not None:
        defaults["TCP_SYN_CNT"] = str(config.tcp_syn_retries)
    return defaults | dict(config.options)


async def _populate_futures(worker: ucx_api.UCXWorker) -> None:
    worker.populate_python_futures_pool()


async def close_endpoint(endpoint: ucx_api.UCXEndpoint) -> None:
    endpoint.close_blocking(period=CLOSE_PERIOD_NS, max_attempts=1)
    endpoint.remove_close_callback()


async def settle(request: ucx_api.UCXRequest) -> None:
    """Waits for a request and retrieves its error, if any (the owner reads it elsewhere)."""
    with contextlib.suppress(Exception):
        await request.wait()


def ucx_buffer(raw: torch.Tensor) -> Array:
    """The buffer UCX reads or writes: host memory through the buffer protocol, device memory
    through `__cuda_array_interface__` (what ucxx's CUDA transports take)."""
    return Array(raw.numpy() if raw.device.type == "cpu" else raw)
