"""`pdserve scale`'s control endpoint: the abstract socket per router port, its JSON both ways,
and its errors (a handler stands in for the cluster; no workers)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from pdserve.cli import main
from pdserve.local import scale_control
from pdserve.local.ports import free_port
from pdserve.local.scale_control import (
    MAX_CONNECTIONS,
    ControlServer,
    NoClusterError,
    control_address,
    parse_request,
    request_scale,
)
from pdserve.local.status import ClusterStatus, Departure, MemberView, ScaleError


class Handler:
    """Answers as a cluster with one prefill and `decode` decode workers would."""

    def __init__(self) -> None:
        self.requests: list[dict[str, int]] = []
        self.lock = threading.Lock()

    def __call__(self, desired: dict[str, int]) -> ClusterStatus:
        with self.lock:
            self.requests.append(desired)
        if desired.get("decode") == 0:
            raise ScaleError("--decode: must be >= 1, got 0")
        decode = desired.get("decode", 1)
        members = [MemberView("prefill-0", "prefill", "198.18.1.2:7010", "ready")]
        members += [
            MemberView(f"decode-{i}", "decode", f"198.18.1.{3 + i}:7020", "ready")
            for i in range(decode)
        ]
        departures = (Departure("decode-3", "198.18.1.9:7020", 0, 1.25),)
        return ClusterStatus({"prefill": 1, "decode": decode}, tuple(members), departures)


@pytest.fixture
def endpoint() -> Iterator[tuple[int, Handler]]:
    port, handler = free_port(), Handler()
    server = ControlServer(port, handler)
    server.start()
    yield port, handler
    server.close()


def test_a_request_reaches_the_cluster_and_its_status_comes_back(
    endpoint: tuple[int, Handler],
) -> None:
    port, handler = endpoint
    status = request_scale(port, {"decode": 3}, timeout_s=5)
    assert handler.requests == [{"decode": 3}]
    assert status.desired == {"prefill": 1, "decode": 3}
    assert status.ready("decode") == 3 and status.ready("prefill") == 1
    assert status.departures == (Departure("decode-3", "198.18.1.9:7020", 0, 1.25),)


def test_the_cluster_s_refusal_reaches_the_caller(endpoint: tuple[int, Handler]) -> None:
    port, _ = endpoint
    with pytest.raises(ScaleError, match="--decode: must be >= 1"):
        request_scale(port, {"decode": 0}, timeout_s=5)
    assert request_scale(port, {}, timeout_s=5).ready("decode") == 1  # it keeps serving


def test_one_endpoint_per_router_port(endpoint: tuple[int, Handler]) -> None:
    port, _ = endpoint
    with pytest.raises(OSError, match=f"router port {port}"):
        ControlServer(port, Handler())


def test_no_cluster_on_the_port_says_scaling_needs_netns() -> None:
    with pytest.raises(NoClusterError, match="needs --netns"):
        request_scale(free_port(), {"decode": 2}, timeout_s=5)


def test_the_cli_prints_counts_and_drains(
    endpoint: tuple[int, Handler], capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = endpoint
    assert main(["scale", "--port", str(port), "--decode", "2"]) == 0
    printed = capsys.readouterr().out
    assert "decode: 2 ready of 2 wanted" in printed
    assert "decode-3" in printed and "drained in 1.25 s" in printed
    assert main(["scale", "--port", str(free_port()), "--decode", "2"]) == 1
    assert "needs --netns" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ([], "JSON object"),
        ({"router": 1}, "'router'"),
        ({"decode": -1}, "--decode"),
        ({"prefill": "2"}, "--prefill"),
        ({"decode": True}, "--decode"),
        ({"decode": 65}, "at most 64 pods"),
    ],
)
def test_bad_requests_name_the_field(message: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_request(message)


# A client that is not pdserve's: the raw protocol, as any local process could speak it.
_RAW_CLIENT = """
import socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(sys.argv[1].encode().replace(b"@", b"\\0", 1))
    s.sendall(b'{"decode": 2}')
    s.shutdown(socket.SHUT_WR)
    print(s.recv(65536).decode())
"""


SYSTEM_PYTHON = "/usr/bin/python3"  # one that another user may run (the venv's may be private)


@pytest.mark.skipif(
    os.getuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason="needs root and a system python3 to run a client as another user",
)
def test_another_user_may_not_scale(endpoint: tuple[int, Handler]) -> None:
    port, handler = endpoint
    address = "@" + control_address(port)[1:]
    nobody = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", _RAW_CLIENT, address],
        user=65534,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "permission denied: uid 65534" in json.loads(nobody.stdout)["error"]
    assert handler.requests == []  # refused before a byte of the request was read


def _silent_client(port: int) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(control_address(port))
    return client


def test_requests_are_bounded_in_number_and_time(
    endpoint: tuple[int, Handler], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, handler = endpoint
    monkeypatch.setattr(scale_control, "REQUEST_TIMEOUT_S", 1.0)
    silent = [_silent_client(port) for _ in range(MAX_CONNECTIONS)]
    try:
        with pytest.raises(TimeoutError):
            request_scale(port, {}, timeout_s=0.3)  # every slot is held: it waits its turn
        for client in silent:  # each silent caller is cut off after the timeout
            client.settimeout(5)
            assert "timed out" in json.loads(client.recv(65536))["error"]
    finally:
        for client in silent:
            client.close()
    assert request_scale(port, {}, timeout_s=5).ready("decode") == 1  # slots free again
    # The caller that gave up had sent its request: answered once a slot freed (counts are
    # desired states, so a late one does what it asked).
    assert handler.requests == [{}, {}]
