"""Real pods (network namespaces on a bridge, as root; no model): pods reach each other only
over the bridge, a pod's loopback is its own, the system resolver inside a pod asks the DNS
server on the gateway, shaping lands on both ends of a link, and nothing is left after close.
Skipped where namespaces cannot be made."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from pdserve.local.dns_registry import DnsRegistry, tier_name
from pdserve.local.netns import LinkShaping, Pod, PodNetwork, choose_subnet, host_routes

from ..chaos.netns_up import link_exists, namespaces, require_netns

PORT = 7070
PREFIX = "pdsnt"  # no router port: a name no `pdserve up` uses


@pytest.fixture
def network() -> Iterator[PodNetwork]:
    require_netns()
    subnet = choose_subnet(4242, host_routes())
    with PodNetwork(PREFIX, subnet, LinkShaping(rate="1gbit")) as made:
        yield made
    assert not [n for n in namespaces() if n.startswith(f"{PREFIX}-")]
    assert not link_exists(f"{PREFIX}br") and not link_exists(f"{PREFIX}v1")


def _in_pod(pod: Pod, code: str, timeout_s: float = 20) -> subprocess.CompletedProcess[str]:
    command = [*pod.exec_prefix(), sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)


def _serve_once(pod: Pod) -> subprocess.Popen[str]:
    """A TCP server in `pod` on PORT (all its addresses) that answers one connection."""
    code = f"""
        import socket
        server = socket.create_server(("0.0.0.0", {PORT}))
        print("listening", flush=True)
        connection, _ = server.accept()
        connection.sendall(b"hello from the pod")
    """
    server = subprocess.Popen(
        [*pod.exec_prefix(), sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdout.readline().strip() == "listening"
    return server


def _connect(target: str) -> str:
    return f"""
        import socket
        try:
            with socket.create_connection(("{target}", {PORT}), timeout=3) as c:
                print(c.recv(100).decode())
        except OSError as error:
            print("refused:", type(error).__name__)
    """


def test_pods_meet_over_the_bridge_and_their_loopbacks_are_their_own(
    network: PodNetwork,
) -> None:
    a, b = network.add_pod("a"), network.add_pod("b")
    assert ipaddress.IPv4Address(a.address) in network.subnet
    server = _serve_once(a)
    try:
        assert _in_pod(b, _connect("127.0.0.1")).stdout.startswith("refused")
        assert _in_pod(b, _connect(a.address)).stdout.strip() == "hello from the pod"
    finally:
        server.kill()
        server.wait()


def test_the_system_resolver_in_a_pod_asks_the_gateway(network: PodNetwork) -> None:
    pod = network.add_pod("router")
    name = tier_name("decode")
    with DnsRegistry(network.gateway, names=[name]) as dns:
        dns.table.add(name, "198.18.255.7")
        dns.table.add(name, "198.18.255.8")
        code = f"""
            import socket
            infos = socket.getaddrinfo("{name}", 1, type=socket.SOCK_STREAM)
            print(sorted({{info[4][0] for info in infos}}))
        """
        answer = _in_pod(pod, code)
    assert answer.stdout.strip() == "['198.18.255.7', '198.18.255.8']", answer.stderr


def test_shaping_sits_on_both_ends_of_the_link(network: PodNetwork) -> None:
    pod = network.add_pod("a")
    outside = subprocess.run(
        ["tc", "qdisc", "show", "dev", pod.host_veth], capture_output=True, text=True, check=True
    )
    inside = subprocess.run(
        ["tc", "-n", pod.namespace, "qdisc", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tbf" in outside.stdout and "rate 1Gbit" in outside.stdout
    assert "tbf" in inside.stdout and "rate 1Gbit" in inside.stdout
