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

A send that times out (its receiver cancelled it, or stalls) can only be released by closing its
endpoint (ucxx has no per-request cancel), which would fail every other transfer to that peer on
it. So the endpoint is retired instead: forgotten here (new transfers connect afresh) and closed
once the sends still on it have settled; the timeout fails its own request only.
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
        self._in_flight: dict[ucx_api.UCXEndpoint, int] = {}  # sends posted and not settled
        self._retired: set[ucx_api.UCXEndpoint] = set()  # closed once none is in flight

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

    def posted(self, endpoint: ucx_api.UCXEndpoint) -> None:
        """Counts a send posted on `endpoint` (any thread)."""
        with self._lock:
            self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1

    def settled(self, endpoint: ucx_api.UCXEndpoint) -> bool:
        """Counts a send on `endpoint` done, failed or given up; whether the endpoint is now
        retired with nothing in flight: the caller closes it."""
        with self._lock:
            if endpoint not in self._in_flight:  # the sender closed meanwhile (`take_all`)
                return False
            left = self._in_flight[endpoint] - 1
            if left:
                self._in_flight[endpoint] = left
                return False
            del self._in_flight[endpoint]
            if endpoint not in self._retired:
                return False
            self._retired.discard(endpoint)
            return True

    def retire(self, peer: bytes, endpoint: ucx_api.UCXEndpoint) -> None:
        """Forgets `endpoint` after a send on it failed or timed out (the next transfer to
        `peer` connects afresh); it is closed once its last send in flight settles."""
        with self._lock:
            if _connected_to(self._connections.get(peer)) is endpoint:
                del self._connections[peer]
            self._retired.add(endpoint)

    def take_all(self) -> list[ucx_api.UCXEndpoint]:
        """Every connected or retired endpoint, forgotten here (closing the sender)."""
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
            retired, self._retired = list(self._retired), set()
            self._in_flight.clear()
        live = [endpoint for c in connections if (endpoint := _connected_to(c)) is not None]
        return live + retired

    def _forget(self, peer: bytes, connection: Connection) -> None:
        with self._lock:
            if self._connections.get(peer) is connection:
                del self._connections[peer]


def _connected_to(connection: Connection | None) -> ucx_api.UCXEndpoint | None:
    """The endpoint of a connection that has connected, else None (pending, failed, none)."""
    if connection is None or not connection.done() or connection.exception() is not None:
        return None
    return connection.result()
