"""The pod network's iproute2 / tc commands, recorded by a fake runner (no namespaces made)."""

from __future__ import annotations

import argparse
import ipaddress
import json
from pathlib import Path

import pytest

from pdserve.local.netns import (
    LinkShaping,
    NetnsError,
    PodNetwork,
    choose_subnet,
    host_routes,
    link_delay,
    link_rate,
    remove_stale,
)


class Recorder:
    """Answers every command with "" and remembers it; fails the one containing `fail_on`."""

    def __init__(self, fail_on: str | None = None, outputs: dict[str, str] | None = None) -> None:
        self.commands: list[str] = []
        self.fail_on = fail_on
        self.outputs = outputs or {}

    def __call__(self, command: list[str]) -> str:
        line = " ".join(command)
        self.commands.append(line)
        if self.fail_on is not None and self.fail_on in line:
            raise NetnsError(f"`{line}` failed: Error: Specified qdisc kind is unknown.")
        return next((out for key, out in self.outputs.items() if line.startswith(key)), "")


SUBNET = ipaddress.IPv4Network("198.18.7.0/24")


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    """Where the pods' resolv.conf folders go (the real one is /etc/netns)."""
    return tmp_path / "netns"


def test_a_pod_gets_a_namespace_a_veth_on_the_bridge_an_address_and_a_route(etc: Path) -> None:
    run = Recorder()
    network = PodNetwork("pds5000", SUBNET, run=run, etc_dir=etc)
    network.open()
    pod = network.add_pod("decode-0")
    assert (pod.namespace, pod.address, pod.host_veth) == (
        "pds5000-decode-0",
        "198.18.7.2",
        "pds5000v1",
    )
    assert network.gateway == "198.18.7.1"
    assert run.commands == [
        "ip link add pds5000br type bridge",
        "ip addr add 198.18.7.1/24 dev pds5000br",
        "ip link set pds5000br up",
        "ip netns add pds5000-decode-0",
        "ip link add pds5000v1 type veth peer name eth0 netns pds5000-decode-0",
        "ip link set pds5000v1 master pds5000br up",
        "ip -n pds5000-decode-0 addr add 198.18.7.2/24 dev eth0",
        "ip -n pds5000-decode-0 link set eth0 up",
        "ip -n pds5000-decode-0 link set lo up",
    ]
    assert pod.exec_prefix() == ["ip", "netns", "exec", "pds5000-decode-0"]
    resolv = (etc / "pds5000-decode-0" / "resolv.conf").read_text()
    assert resolv.startswith("nameserver 198.18.7.1\n")  # the DNS server on the gateway


def test_close_removes_every_pod_then_the_bridge(etc: Path) -> None:
    run = Recorder()
    network = PodNetwork("pds5000", SUBNET, run=run, etc_dir=etc)
    network.open()
    network.add_pod("prefill-0")
    network.add_pod("decode-0")
    run.commands.clear()
    network.close()
    assert [c for c in run.commands if "del" in c] == [
        "ip netns del pds5000-prefill-0",
        "ip link del pds5000v1",
        "ip netns del pds5000-decode-0",
        "ip link del pds5000v2",
        "ip link del pds5000br",
    ]
    assert network.pods == []
    assert not any(etc.iterdir())


def test_a_failure_half_way_through_a_pod_removes_what_was_made(etc: Path) -> None:
    run = Recorder(fail_on="lo up")
    network = PodNetwork("pds5000", SUBNET, run=run, etc_dir=etc)
    network.open()
    with pytest.raises(NetnsError):
        network.add_pod("decode-0")
    assert run.commands[-2:] == ["ip netns del pds5000-decode-0", "ip link del pds5000v1"]
    assert network.pods == []
    run.fail_on = None
    assert network.add_pod("decode-1").address == "198.18.7.3"  # the failed one's comes back last


def test_shaping_puts_one_qdisc_on_each_end_of_every_link(etc: Path) -> None:
    run = Recorder()
    network = PodNetwork("pds5000", SUBNET, LinkShaping(rate="1gbit"), run=run, etc_dir=etc)
    network.add_pod("decode-0")
    assert run.commands[-2:] == [
        "tc qdisc add dev pds5000v1 root tbf rate 1gbit burst 1mbit latency 100ms",
        "tc -n pds5000-decode-0 qdisc add dev eth0 root tbf rate 1gbit burst 1mbit latency 100ms",
    ]
    assert LinkShaping(rate="1gbit", delay="1ms").qdisc() == [
        "netem",
        "delay",
        "1ms",
        "rate",
        "1gbit",
    ]  # fmt: the netem qdisc carries the rate itself
    assert LinkShaping(delay="200us").qdisc() == ["netem", "delay", "200us"]


def test_a_kernel_without_the_qdisc_is_named_and_the_pod_undone(etc: Path) -> None:
    run = Recorder(fail_on="netem")
    network = PodNetwork("pds5000", SUBNET, LinkShaping(delay="1ms"), run=run, etc_dir=etc)
    with pytest.raises(NetnsError, match="no netem qdisc"):
        network.add_pod("decode-0")
    assert "ip netns del pds5000-decode-0" in run.commands
    assert network.pods == []


def test_the_subnet_avoids_every_routed_network() -> None:
    taken = [ipaddress.IPv4Network("198.18.0.0/23"), ipaddress.IPv4Network("10.0.0.0/8")]
    assert choose_subnet(512, taken) == ipaddress.IPv4Network("198.18.2.0/24")  # 512 % 512 = 0
    assert choose_subnet(5, taken) == ipaddress.IPv4Network("198.18.5.0/24")
    with pytest.raises(NetnsError):
        choose_subnet(0, [ipaddress.IPv4Network("198.18.0.0/15")])


def test_host_routes_reads_iproute2_json() -> None:
    listing = '[{"dst":"default"},{"dst":"192.0.2.0/24"},{"dst":"127.0.0.1"}]'
    run = Recorder(outputs={"ip -j -4 route": listing})
    assert host_routes(run) == [
        ipaddress.IPv4Network("192.0.2.0/24"),
        ipaddress.IPv4Network("127.0.0.1/32"),
    ]


def test_remove_stale_clears_only_this_prefix(tmp_path: Path) -> None:
    listing = '[{"name":"pds5000-decode-0"},{"name":"pds50001-decode-0"},{"name":"other"}]'
    names = ["pds5000v3", "pds5000br", "pds50001v1", "eth0"]
    links = json.dumps([{"ifname": name} for name in names])
    run = Recorder(outputs={"ip -j netns list": listing, "ip -j link show": links})
    (tmp_path / "pds5000-decode-0").mkdir()
    (tmp_path / "pds50001-decode-0").mkdir()
    removed = remove_stale("pds5000", run, tmp_path)
    assert removed == ["pds5000-decode-0", "pds5000v3", "pds5000br"]
    assert "ip netns del pds50001-decode-0" not in run.commands
    assert [folder.name for folder in tmp_path.iterdir()] == ["pds50001-decode-0"]


def test_link_flags_take_tc_units_only() -> None:
    assert link_rate("1gbit") == "1gbit" and link_rate("250Mbit") == "250Mbit"
    assert link_delay("1ms") == "1ms" and link_delay("0.5ms") == "0.5ms"
    for bad_rate in ("1", "fast", "1gb"):
        with pytest.raises(argparse.ArgumentTypeError):
            link_rate(bad_rate)
    with pytest.raises(argparse.ArgumentTypeError):
        link_delay("1 ms")


def test_interface_names_stay_within_linux_limits(etc: Path) -> None:
    with pytest.raises(NetnsError, match="exceed"):
        PodNetwork("pds-a-very-long-prefix", SUBNET, run=Recorder(), etc_dir=etc)
