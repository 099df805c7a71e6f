"""The prefill side's UCX endpoints, one per peer, connected off the thread that sends.

Creating an endpoint from a worker address blocks until UCX has connected or given up: about
0.1 s to a live peer, but minutes to an address that drops packets without an answer, such as a
pod whose process was killed and whose network went with it (the kernel retries the TCP SYN for
127 s by default, and resolves the address for tens of seconds first). A sender that connected on
its caller's thread stopped a whole prefill worker that long: its engine thread pushes KV from
inside the forward pass, so one push towards a SIGKILLed decode pod held back every other
request, and their reservations on healthy decode workers expired behind it.

So each connect runs on a daemon thread of its own, and the caller gets a future: done at once
for a peer already connected, and bounded by whoever awaits it. A connect that failed is forgotten,
so the next transfer tries again; one still pending is shared by every transfer to that peer.
"""

from __future__ import annotations

import concurrent.futures
import threading

import ucxx._lib.libucxx as ucx_api

from pdserve.core.transfer.ucx_runtime import UcxRuntime

Connection = concurrent.futures.Future[ucx_api.UCXEndpoint]


class Endpoints:
    """Endpoints to peers by worker address, each connected once, in the background."""

    def __init__(self, runtime: UcxRuntime) -> None:
        self._runtime = runtime
        self._lock = threading.Lock()
        self._connections: dict[bytes, Connection] = {}

    def connection(self, peer: bytes) -> Connection:
        """The endpoint to `peer`, connecting if there is none (never blocks)."""
        with self._lock:
            connection = self._connections.get(peer)
            if connection is None:
                connection = Connection()
                self._connections[peer] = connection
                threading.Thread(
                    target=self._connect,
                    args=(peer, connection),
                    name="pdserve-ucx-connect",
                    daemon=True,  # a connect to a dead peer must not hold the process at exit
                ).start()
            return connection

    def _connect(self, peer: bytes, connection: Connection) -> None:
        try:
            endpoint = ucx_api.UCXEndpoint.create_from_worker_address(
                self._runtime.worker,
                ucx_api.UCXAddress.create_from_buffer(peer),
                self._runtime.config.endpoint_error_handling,
            )
        except Exception as error:
            self._forget(peer, connection)
            connection.set_exception(error)
            return
        connection.set_result(endpoint)

    def drop(self, peer: bytes) -> ucx_api.UCXEndpoint | None:
        """Forgets `peer`'s endpoint after a failed send; the endpoint to close, if it had
        connected (a connect still pending is kept: the transfers waiting on it time out)."""
        with self._lock:
            connection = self._connections.get(peer)
            if connection is None or not connection.done():
                return None
            del self._connections[peer]
        return None if connection.exception() is not None else connection.result()

    def take_all(self) -> list[ucx_api.UCXEndpoint]:
        """Every connected endpoint, forgotten here (closing the sender)."""
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        return [c.result() for c in connections if c.done() and c.exception() is None]

    def _forget(self, peer: bytes, connection: Connection) -> None:
        with self._lock:
            if self._connections.get(peer) is connection:
                del self._connections[peer]
