"""A prefill peer and a decode peer in their own processes, driven over a pipe by the tests.

Each peer sets the UCX environment before anything imports ucxx, builds a real KVCache and a real
KVSender / KVReceiver, sends its UCX worker address (decode) up the pipe, then answers commands
`(name, args)` with `("ok", value)` or `("error", exception class name, message)`.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import stat
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pdserve.core.kv.cache import KVLayout
from pdserve.local.netns import POD_INTERFACE, Pod

POLL_INTERVAL_S = 0.001
# 4 layers x 3 heads x 64 dims x 16 tokens x float32: 96 KiB a block, above UCX's rendezvous
# threshold like the real model's blocks (720 KiB), so the zero-copy path is the one tested.
LAYOUT = KVLayout(num_layers=4, num_kv_heads=3, head_dim=64, block_size=16, dtype="float32")
NUM_BLOCKS = 12
SEND_TIMEOUT_S = 2.0
STARTUP_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 20.0
TRANSPORTS = {"sm": "sm,self", "tcp": "tcp"}


class PeerError(Exception):
    """An exception raised inside a peer process, by class name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class Peer:
    """One peer process and the pipe that drives it; `stop()` always reaps the process."""

    def __init__(
        self,
        role: str,
        tls: str,
        layout: KVLayout = LAYOUT,
        num_blocks: int = NUM_BLOCKS,
        num_pieces: int = 1,
        device: str = "cpu",
        staging: str = "host",
        pod: Pod | None = None,
        send_timeout_s: float = SEND_TIMEOUT_S,
        staging_limit_bytes: int | None = None,
    ) -> None:
        """`pod`: the peer runs in that network namespace, over its pod link, with endpoint
        error handling on, as the tiers run across pods."""
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        env = {
            "UCX_TLS": tls,
            "UCX_NET_DEVICES": "lo" if pod is None else POD_INTERFACE,
            "UCXPY_ENABLE_PYTHON_FUTURE": "1",
            "UCX_WARN_UNUSED_ENV_VARS": "n",
        }
        config = (num_pieces, device, staging, pod is not None, send_timeout_s, staging_limit_bytes)
        args = (child, role, env, layout, num_blocks, config)
        self.process = context.Process(target=run_peer, args=args, daemon=True)
        self._wrapper_dir = None if pod is None else Path(tempfile.mkdtemp(prefix="pdserve-peer-"))
        if pod is not None and self._wrapper_dir is not None:
            # spawn runs the child through it
            context.set_executable(_python_in(pod, self._wrapper_dir))
        try:
            self.process.start()
        finally:
            context.set_executable(sys.executable)
        child.close()
        self.address: bytes = self._receive(STARTUP_TIMEOUT_S)

    def call(self, name: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        self._conn.send((name, args))
        reply = self._receive(timeout_s)
        if reply[0] == "error":
            raise PeerError(reply[1], reply[2])
        return reply[1]

    def stop(self) -> None:
        try:
            if self.process.is_alive():
                self.call("stop", timeout_s=10.0)
        except (OSError, EOFError, TimeoutError):
            pass
        self.process.join(timeout=10.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5.0)
        self._conn.close()
        if self._wrapper_dir is not None:
            shutil.rmtree(self._wrapper_dir, ignore_errors=True)

    def _receive(self, timeout_s: float) -> Any:
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"peer {self.process.pid} gave no answer within {timeout_s} s")
        return self._conn.recv()


def _python_in(pod: Pod, folder: Path) -> str:
    """An executable in `folder` that runs this Python inside `pod` (what spawn starts children
    with)."""
    wrapper = folder / "python"
    prefix = " ".join(pod.exec_prefix())
    wrapper.write_text(f'#!/bin/sh\nexec {prefix} {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def run_peer(
    conn: Connection,
    role: str,
    env: dict[str, str],
    layout: KVLayout,
    num_blocks: int,
    config_args: tuple[int, str, str, bool, float, int | None],
) -> None:
    num_pieces, device, staging, error_handling, send_timeout_s, staging_limit = config_args
    os.environ.update(env)
    import torch

    from pdserve.core.kv.cache import KVCache
    from pdserve.core.transfer.staging import StagingPlace
    from pdserve.core.transfer.ucx import KVReceiver
    from pdserve.core.transfer.ucx_runtime import UcxConfig
    from pdserve.core.transfer.ucx_sender import KVSender

    cache = KVCache(layout, num_blocks, device)
    generator = torch.Generator().manual_seed(1 if role == "prefill" else 2)
    cache.tensor.copy_(torch.randn(cache.tensor.shape, generator=generator))
    config = UcxConfig(
        endpoint_error_handling=error_handling,
        send_timeout_s=send_timeout_s,
        staging=StagingPlace(staging),
        staging_limit_bytes=staging_limit,
    )
    peer: KVReceiver | KVSender = (
        KVReceiver(cache, config, num_pieces) if role == "decode" else KVSender(config)
    )
    conn.send(peer.address() if isinstance(peer, KVReceiver) else b"")
    try:
        _serve(conn, peer, cache)
    finally:
        peer.close()
        conn.close()


def _serve(conn: Connection, peer: Any, cache: Any) -> None:
    while True:
        name, args = conn.recv()
        if name == "stop":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", _COMMANDS[name](peer, cache, *args)))
        except Exception as error:
            conn.send(("error", type(error).__name__, str(error)))


def _wait(peer: Any, cache: Any, request_id: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    state = peer.poll(request_id)
    while state.value == "pending" and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
        state = peer.poll(request_id)
    return str(state.value)


def _send(peer: Any, cache: Any, descriptor: Any, src: list[int], num_tokens: int) -> Any:
    from pdserve.core.transfer.interface import send_whole

    return send_whole(peer, descriptor, cache, src, num_tokens).result()


def _push(peer: Any, cache: Any, descriptor: Any, src: list[int], pieces: list[int]) -> str:
    """Pushes only `pieces` (in that order); answers how `done()` ended ("ok" or the error)."""
    sending = peer.open(descriptor, cache, src, len(src) * descriptor.layout.block_size)
    for piece in pieces:
        sending.push(piece)
    try:
        sending.done().result()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "ok"


def _send_short(peer: Any, cache: Any, descriptor: Any, piece: int) -> None:
    """Sends one zero byte with piece `piece`'s tag: a message too short to carry the token."""
    import numpy as np
    import ucxx._lib.libucxx as ucx_api
    from ucxx._lib.arr import Array

    from pdserve.core.transfer.interface import piece_tag

    endpoint = peer.endpoints.connection(descriptor.peer_address).result(timeout=CALL_TIMEOUT_S)
    tag = ucx_api.UCXXTag(piece_tag(descriptor.token, piece))
    request = endpoint.tag_send(Array(np.zeros(1, dtype=np.uint8)), tag)
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while not request.completed and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)


def _send_and_die(peer: Any, cache: Any, descriptor: Any, src: list[int], after_s: float) -> None:
    """Posts the send, then dies mid-transfer as a SIGKILLed prefill worker would."""
    from pdserve.core.transfer.interface import send_whole

    send_whole(peer, descriptor, cache, src, len(src) * descriptor.layout.block_size)
    time.sleep(after_s)
    os._exit(1)


def _send_then_stall(
    peer: Any, cache: Any, descriptor: Any, src: list[int], after_s: float
) -> None:
    """Posts the send and returns; `after_s` later this process stops (SIGSTOP) mid-transfer, as
    a prefill pod whose node froze would: its receiver's matched receive makes no progress."""
    import signal
    import threading

    from pdserve.core.transfer.interface import send_whole

    send_whole(peer, descriptor, cache, src, len(src) * descriptor.layout.block_size)
    threading.Timer(after_s, os.kill, (os.getpid(), signal.SIGSTOP)).start()


def _send_staggered(
    peer: Any, cache: Any, transfers: list[tuple[Any, list[int], float]]
) -> list[str]:
    """Sends each transfer at its start (seconds from now), then each one's "ok" or error."""
    from pdserve.core.transfer.interface import send_whole

    started = time.monotonic()
    sendings = []
    for descriptor, src, start_s in transfers:
        time.sleep(max(0.0, started + start_s - time.monotonic()))
        num_tokens = len(src) * descriptor.layout.block_size
        sendings.append(send_whole(peer, descriptor, cache, src, num_tokens))
    outcomes = []
    for sending in sendings:
        try:
            sending.result(timeout=CALL_TIMEOUT_S)
            outcomes.append("ok")
        except Exception as error:
            outcomes.append(f"{type(error).__name__}: {error}")
    return outcomes


def _timed_cancel(peer: Any, cache: Any, request_id: str) -> float:
    """Seconds `cancel` took, timed where it runs (no pipe in between)."""
    started = time.perf_counter()
    peer.cancel(request_id)
    return time.perf_counter() - started


def _send_all(peer: Any, cache: Any, transfers: list[tuple[Any, list[int]]]) -> Any:
    """Pushes every transfer before waiting for any; (seconds the pushes took, then each
    transfer's "ok" or error and the seconds from the first push until it settled)."""
    started = time.monotonic()
    sendings = []
    for descriptor, src in transfers:
        sending = peer.open(descriptor, cache, src, len(src) * descriptor.layout.block_size)
        for piece in range(descriptor.num_pieces):
            sending.push(piece)
        sendings.append(sending.done())
    pushed_s = time.monotonic() - started
    outcomes = []
    for done in sendings:
        try:
            done.result(timeout=CALL_TIMEOUT_S * 3)
            outcome = "ok"
        except Exception as error:
            outcome = f"{type(error).__name__}: {error}"
        outcomes.append((outcome, time.monotonic() - started))
    return pushed_s, outcomes


def _resolve(peer: Any, cache: Any, address: str) -> None:
    """One UDP datagram to `address`: this pod's kernel learns its hardware address, as any
    earlier traffic to it would have taught it."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"hello", (address, 9))
    time.sleep(0.2)


def _collect_garbage(peer: Any, cache: Any) -> int:
    import gc

    return gc.collect()


_COMMANDS: dict[str, Any] = {
    "send_and_die": _send_and_die,
    "send_then_stall": _send_then_stall,
    "send_staggered": _send_staggered,
    "timed_cancel": _timed_cancel,
    "cancelling": lambda peer, cache: peer.num_cancelling,
    "waiting_for_staging": lambda peer, cache: peer.num_waiting_for_staging,
    "gc": _collect_garbage,
    "expect": lambda peer, cache, *a: peer.expect(*a),
    "poll": lambda peer, cache, rid: peer.poll(rid).value,
    "wait": _wait,
    "cancel": lambda peer, cache, rid: peer.cancel(rid),
    "tracked": lambda peer, cache: peer.num_tracked,
    "send": _send,
    "send_all": _send_all,
    "resolve": _resolve,
    "push": _push,
    "send_short": _send_short,
    "idle_staging": lambda peer, cache: (
        peer.idle_staging_bytes if hasattr(peer, "idle_staging_bytes") else peer.pool.idle_bytes
    ),
    "cache": lambda peer, cache: cache.tensor.cpu().clone(),
    "rejected": lambda peer, cache: peer.rejected_messages,
    "counters": lambda peer, cache: (
        getattr(peer, "bytes_received", getattr(peer, "bytes_sent", 0)),
        peer.seconds,
    ),
}
