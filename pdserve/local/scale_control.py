"""The control endpoint of `pdserve up --netns`, which `pdserve scale` calls.

One abstract Unix socket per router port (`@pdserve-up-PORT`): keyed by the port as
`pdserve scale --port` is, reachable only from this machine's root network namespace, and gone
with the process that bound it, so no file can go stale and a second `pdserve up --netns` for
the same port fails to bind it. One JSON object each way per connection: the request names the
desired count of each tier to change (`{"decode": 3}`; `{}` asks for the status only), the reply
is the cluster's status once it has reached those counts, or `{"error": "..."}`.

Who may ask: a process of the same user only (the kernel's SO_PEERCRED, checked before a byte
is read; `pdserve up --netns` runs as root, so only root may scale it). How much: at most
MAX_PODS_PER_TIER pods of a tier, MAX_CONNECTIONS requests answered at once (more wait in the
listen backlog, within their own timeout), and each request must arrive within
REQUEST_TIMEOUT_S, so no caller can hold the endpoint's threads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from pdserve.local.status import ClusterStatus, Departure, MemberView, ScaleError

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20
MAX_PODS_PER_TIER = 64
MAX_CONNECTIONS = 8
REQUEST_TIMEOUT_S = 10.0
_PEER_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
Handler = Callable[[dict[str, int]], ClusterStatus]


class NoClusterError(ConnectionError):
    """Nothing answers for this router port (no `pdserve up --netns` runs with it)."""


def control_address(port: int) -> str:
    return f"\0pdserve-up-{port}"


class ControlServer:
    """Answers scale requests with `handle` (one thread per connection; daemon threads)."""

    def __init__(self, port: int, handle: Handler) -> None:
        self._handle = handle
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._socket.bind(control_address(port))
        except OSError as error:
            self._socket.close()
            raise OSError(f"another `pdserve up --netns` runs with router port {port}") from error
        self._socket.listen()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._thread = threading.Thread(target=self._serve, name="pdserve-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._socket.close()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            self._slots.acquire()  # a slot frees within REQUEST_TIMEOUT_S, or once answered
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            try:
                reply = self._reply(connection)
                with contextlib.suppress(OSError):  # the caller may have given up
                    connection.sendall(json.dumps(reply).encode())
            finally:
                self._slots.release()

    def _reply(self, connection: socket.socket) -> dict[str, Any]:
        uid = peer_uid(connection)
        if uid != os.getuid():
            return {"error": f"permission denied: uid {uid} may not scale this cluster"}
        connection.settimeout(REQUEST_TIMEOUT_S)
        try:
            desired = parse_request(json.loads(_receive(connection)))
            return {"status": asdict(self._handle(desired))}
        except (ScaleError, ValueError, TimeoutError) as error:  # socket timeouts included
            return {"error": str(error)}
        except Exception as error:  # the caller hears of it; the endpoint keeps serving
            log.exception("scale request failed")
            return {"error": f"{type(error).__name__}: {error}"}


def parse_request(message: object) -> dict[str, int]:
    """`{"prefill": N, "decode": M}`, either optional; a ValueError names a bad field."""
    if not isinstance(message, dict):
        raise ValueError("request: expected a JSON object")
    desired: dict[str, int] = {}
    for key, value in message.items():
        if key not in ("prefill", "decode"):
            raise ValueError(f"request: unknown field {key!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"--{key}: expected a count >= 0, got {value!r}")
        if value > MAX_PODS_PER_TIER:
            raise ValueError(f"--{key}: at most {MAX_PODS_PER_TIER} pods, got {value}")
        desired[key] = value
    return desired


def request_scale(port: int, desired: Mapping[str, int], timeout_s: float) -> ClusterStatus:
    """Asks the `pdserve up --netns` of router port `port` for these counts; waits for them."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout_s)
        try:
            connection.connect(control_address(port))
        except (ConnectionRefusedError, FileNotFoundError) as error:
            raise NoClusterError(
                f"no `pdserve up --netns` runs with router port {port} (scaling needs --netns: "
                "without it the router has a fixed list of workers)"
            ) from error
        connection.sendall(json.dumps(dict(desired)).encode())
        connection.shutdown(socket.SHUT_WR)  # the request is complete
        reply = json.loads(_receive(connection))
    if "error" in reply:
        raise ScaleError(reply["error"])
    return status_from_json(reply["status"])


def status_from_json(status: dict[str, Any]) -> ClusterStatus:
    return ClusterStatus(
        desired={str(k): int(v) for k, v in status["desired"].items()},
        members=tuple(MemberView(**member) for member in status["members"]),
        departures=tuple(Departure(**departure) for departure in status["departures"]),
    )


def peer_uid(connection: socket.socket) -> int:
    """The user id of the process at the other end (the kernel's word, not the peer's)."""
    credentials = connection.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER_CREDENTIALS.size
    )
    _pid, uid, _gid = _PEER_CREDENTIALS.unpack(credentials)
    return int(uid)


def _receive(connection: socket.socket) -> bytes:
    """Everything until the peer shuts its side (bounded)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := connection.recv(65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_MESSAGE_BYTES:
            raise ValueError(f"message larger than {MAX_MESSAGE_BYTES} bytes")
    return b"".join(chunks)
