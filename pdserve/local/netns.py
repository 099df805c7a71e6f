"""Pods on one machine: one network namespace per process on a Linux bridge (iproute2, as root).

`pdserve up --netns` gives every process (router and workers) a pod: a network namespace whose
only interface besides its own loopback is `eth0`, one end of a veth pair whose other end is
enslaved to a bridge in the root namespace. Each pod has one address on a private /24; the
bridge holds the gateway (`.1`), so the root namespace (clients, `pdserve up` itself, the DNS
server) reaches every pod, and pods reach each other, only across the bridge: a pod's
127.0.0.1 is its own. Every pod's /etc/resolv.conf (`/etc/netns/NS/resolv.conf`, which
`ip netns exec` mounts over it) names the DNS server on the gateway.

Optional shaping (`LinkShaping`) puts a tc qdisc on both ends of each veth, so each direction
of every pod's link gets the rate and the delay (a round trip between two pods crosses four
qdiscs: twice the delay each way).

Everything is recorded as it is made and removed by `close()` (pods, then the bridge), so a
failure half-way through setting up leaves nothing behind; deleting a namespace deletes its veth
pair.
Names start with `pds<router port>` so that `remove_stale` can clear what a killed
`pdserve up` on the same port left.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SUBNET_POOL = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544: set aside for test networks
POD_PREFIX_LEN = 24
NETNS_ETC = Path("/etc/netns")
POD_INTERFACE = "eth0"  # inside every pod, as on Kubernetes
IFNAME_MAX = 15  # Linux interface names


class NetnsError(RuntimeError):
    """A pod network could not be made (not root, no iproute2, a clash with the host's routes)."""


@dataclass(frozen=True)
class LinkShaping:
    """tc settings for every pod link, each direction: `rate` in tc's units (`1gbit`,
    `500mbit`), `delay` in tc's time units (`1ms`, `200us`). Delay needs the netem qdisc; a
    rate alone uses tbf."""

    rate: str | None = None
    delay: str | None = None

    @property
    def enabled(self) -> bool:
        return self.rate is not None or self.delay is not None

    def qdisc(self) -> list[str]:
        """The `tc qdisc add dev DEV root ...` tail."""
        if self.delay is not None:
            rate = ["rate", self.rate] if self.rate is not None else []
            return ["netem", "delay", self.delay, *rate]
        if self.rate is not None:
            # burst: the 10 ms worth of bytes at 1gbit the kernel's docs advise as a floor;
            # latency bounds the queue rather than dropping a KV transfer's bursts early.
            return ["tbf", "rate", self.rate, "burst", "1mbit", "latency", "100ms"]
        return []


NO_SHAPING = LinkShaping()


@dataclass(frozen=True)
class Pod:
    """One network namespace with its address on the bridge."""

    name: str  # e.g. decode-2
    namespace: str  # e.g. pds50051-decode-2
    address: str
    host_veth: str  # the bridge's end of its link

    def exec_prefix(self) -> list[str]:
        """What a command is prefixed with to run inside this pod."""
        return ["ip", "netns", "exec", self.namespace]


Runner = Callable[[list[str]], str]


def run_command(command: list[str]) -> str:
    """Runs one iproute2 / tc command; a NetnsError carries its stderr."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError as error:
        raise NetnsError(f"{command[0]} is not installed (iproute2 is needed)") from error
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done.stdout


def choose_subnet(port: int, routes: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /24 of `SUBNET_POOL` that overlaps none of the host's routes, tried from one derived
    from the router port (so that two `pdserve up --netns` on different ports rarely clash)."""
    subnets = list(SUBNET_POOL.subnets(new_prefix=POD_PREFIX_LEN))
    start = port % len(subnets)
    for subnet in subnets[start:] + subnets[:start]:
        if not any(subnet.overlaps(route) for route in routes):
            return subnet
    raise NetnsError(f"every /{POD_PREFIX_LEN} of {SUBNET_POOL} is routed on this host already")


def host_routes(run: Runner = run_command) -> list[ipaddress.IPv4Network]:
    """The IPv4 destinations routed in the root namespace (`default` left out)."""
    routes = json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]")
    return [
        ipaddress.IPv4Network(route["dst"], strict=False)
        for route in routes
        if route.get("dst", "default") != "default" and ":" not in route["dst"]
    ]


class PodNetwork:
    """A bridge and the pods on it; `open()` first, `close()` always."""

    def __init__(
        self,
        prefix: str,
        subnet: ipaddress.IPv4Network,
        shaping: LinkShaping = NO_SHAPING,
        run: Runner = run_command,
        etc_dir: Path = NETNS_ETC,
    ) -> None:
        self.prefix = prefix
        self.etc_dir = etc_dir
        self.subnet = subnet
        self.shaping = shaping
        self.bridge = f"{prefix}br"
        if len(self.bridge) > IFNAME_MAX:
            raise NetnsError(f"prefix {prefix!r}: interface names would exceed {IFNAME_MAX}")
        hosts = list(subnet.hosts())
        self.gateway = str(hosts[0])
        self._free = [str(host) for host in hosts[1:]]
        self._run = run
        self._bridge_made = False
        self._pods: dict[str, Pod] = {}
        self._serial = 0

    def open(self) -> None:
        self._run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._bridge_made = True
        self._run(["ip", "addr", "add", f"{self.gateway}/{POD_PREFIX_LEN}", "dev", self.bridge])
        self._run(["ip", "link", "set", self.bridge, "up"])

    def add_pod(self, name: str) -> Pod:
        """A new namespace on the bridge, its links up and shaped; undone by `remove_pod`."""
        if not self._free:
            raise NetnsError(f"{self.subnet} has no address left for pod {name}")
        self._serial += 1
        pod = Pod(
            name=name,
            namespace=f"{self.prefix}-{name}",
            address=self._free.pop(0),
            host_veth=f"{self.prefix}v{self._serial}",
        )
        if len(pod.host_veth) > IFNAME_MAX:
            raise NetnsError(f"interface name {pod.host_veth!r} exceeds {IFNAME_MAX} characters")
        self._pods[name] = pod
        try:
            self._wire(pod)
        except BaseException:
            self.remove_pod(pod)
            raise
        return pod

    def _wire(self, pod: Pod) -> None:
        namespace, inside = ["ip", "-n", pod.namespace], POD_INTERFACE
        self._run(["ip", "netns", "add", pod.namespace])
        _write_resolv_conf(self.etc_dir / pod.namespace, self.gateway)
        peer = ["peer", "name", inside, "netns", pod.namespace]
        self._run(["ip", "link", "add", pod.host_veth, "type", "veth", *peer])
        self._run(["ip", "link", "set", pod.host_veth, "master", self.bridge, "up"])
        self._run([*namespace, "addr", "add", f"{pod.address}/{POD_PREFIX_LEN}", "dev", inside])
        self._run([*namespace, "link", "set", inside, "up"])
        self._run([*namespace, "link", "set", "lo", "up"])
        if self.shaping.enabled:
            qdisc = self.shaping.qdisc()
            self._shape(["tc", "qdisc", "add", "dev", pod.host_veth, "root", *qdisc])
            self._shape(["tc", "-n", pod.namespace, "qdisc", "add", "dev", inside, "root", *qdisc])

    def _shape(self, command: list[str]) -> None:
        try:
            self._run(command)
        except NetnsError as error:
            if "unknown" not in str(error).lower():
                raise
            kind = self.shaping.qdisc()[0]
            raise NetnsError(f"this kernel has no {kind} qdisc (tc: {error})") from error

    def remove_pod(self, pod: Pod) -> None:
        """Deletes the namespace (and with it both ends of its veth pair); idempotent."""
        if self._pods.pop(pod.name, None) is None:
            return
        with contextlib.suppress(NetnsError):
            self._run(["ip", "netns", "del", pod.namespace])
        with contextlib.suppress(NetnsError):  # the bridge end, if its peer never reached the pod
            self._run(["ip", "link", "del", pod.host_veth])
        shutil.rmtree(self.etc_dir / pod.namespace, ignore_errors=True)
        self._free.append(pod.address)  # reused last: a lingering router entry meets no newcomer

    @property
    def pods(self) -> list[Pod]:
        return list(self._pods.values())

    def close(self) -> None:
        for pod in self.pods:
            self.remove_pod(pod)
        if self._bridge_made:
            with contextlib.suppress(NetnsError):
                self._run(["ip", "link", "del", self.bridge])
            self._bridge_made = False

    def __enter__(self) -> PodNetwork:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_resolv_conf(folder: Path, nameserver: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    # No search domains, one-second timeouts: a slow answer must not stall the router's
    # re-resolution for long.
    text = f"nameserver {nameserver}\noptions timeout:1 attempts:2\n"
    (folder / "resolv.conf").write_text(text)


def remove_stale(prefix: str, run: Runner = run_command, etc_dir: Path = NETNS_ETC) -> list[str]:
    """Deletes what a killed `pdserve up` with this prefix left: the processes in its
    namespaces, the namespaces (their veths go with them), its bridge and its /etc/netns
    folders. Returns what it removed."""
    removed = []
    for namespace in _namespaces(run):
        if namespace.startswith(f"{prefix}-"):
            _kill_pods_processes(run, namespace)  # else they live on, unreachable
            if _delete(run, ["ip", "netns", "del", namespace]):
                removed.append(namespace)
    for folder in etc_dir.glob(f"{prefix}-*"):
        shutil.rmtree(folder, ignore_errors=True)
    # A namespace outlives its name while anything still holds it, and its veth with it.
    links = [name for name in _links(run) if re.fullmatch(rf"{prefix}(v\d+|br)", name)]
    removed += [link for link in links if _delete(run, ["ip", "link", "del", link])]
    return removed


def _namespaces(run: Runner) -> list[str]:
    listing = json.loads(run(["ip", "-j", "netns", "list"]) or "[]")
    return [str(entry["name"]) for entry in listing]


def _links(run: Runner) -> list[str]:
    listing = json.loads(run(["ip", "-j", "link", "show"]) or "[]")
    return [str(entry["ifname"]) for entry in listing]


def _kill_pods_processes(run: Runner, namespace: str) -> None:
    try:
        pids = run(["ip", "netns", "pids", namespace]).split()
    except NetnsError:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _delete(run: Runner, command: list[str]) -> bool:
    try:
        run(command)
    except NetnsError:
        return False
    return True


_RATE = re.compile(r"\d+(\.\d+)?([kmgt]?bit|[kmgt]?bps)", re.IGNORECASE)
_TIME = re.compile(r"\d+(\.\d+)?(s|ms|us)")


def link_rate(text: str) -> str:
    """An argparse type: a tc rate (`1gbit`, `500mbit`, `100mbps`)."""
    if not _RATE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected a tc rate such as 1gbit, got {text!r}")
    return text


def link_delay(text: str) -> str:
    """An argparse type: a tc time (`1ms`, `200us`)."""
    if not _TIME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected a tc time such as 1ms, got {text!r}")
    return text
