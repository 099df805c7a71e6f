"""`pdserve scale`'s control endpoint: the abstract socket per router port, its JSON both ways,
and its errors (a handler stands in for the cluster; no workers)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from pdserve.cli import main
from pdserve.local.scale_control import ControlServer, NoClusterError, parse_request, request_scale
from pdserve.local.status import ClusterStatus, Departure, MemberView, ScaleError


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    port, handler = _unused_port(), Handler()
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
        request_scale(_unused_port(), {"decode": 2}, timeout_s=5)


def test_the_cli_prints_counts_and_drains(
    endpoint: tuple[int, Handler], capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = endpoint
    assert main(["scale", "--port", str(port), "--decode", "2"]) == 0
    printed = capsys.readouterr().out
    assert "decode: 2 ready of 2 wanted" in printed
    assert "decode-3" in printed and "drained in 1.25 s" in printed
    assert main(["scale", "--port", str(_unused_port()), "--decode", "2"]) == 1
    assert "needs --netns" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ([], "JSON object"),
        ({"router": 1}, "'router'"),
        ({"decode": -1}, "--decode"),
        ({"prefill": "2"}, "--prefill"),
        ({"decode": True}, "--decode"),
    ],
)
def test_bad_requests_name_the_field(message: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        parse_request(message)
