"""`pdserve up --netns` as a user runs it (its own process, stopped with Ctrl-C), `pdserve scale`
as a user calls it, and what a test reads of the pods: whether namespaces can be made here, a
pod's link counters, the pids in a pod; `pdserve autoscale` beside it."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pdserve.local.ports import free_port_bases

from ..integration.conftest import WORKER_ARGS

READY = "ready: pdserve.v1.Generation on "
HTTP = "OpenAI HTTP API on "


def require_netns() -> None:
    """Skips the calling test where pods cannot be made (asked once per session)."""
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)


@functools.cache
def netns_unavailable() -> str | None:
    """Why pods cannot be made on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "pdserve up --netns needs root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"pdserve-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` is not allowed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=True)
    return None


class NetnsUp:
    """One `pdserve up --netns`; its router's address is read from what it prints."""

    def __init__(
        self,
        model_dir: Path,
        log_dir: Path,
        drain_grace_s: float,
        env: dict[str, str] | None = None,
        up_args: tuple[str, ...] = (),
    ) -> None:
        """`env`: added to this environment for `pdserve up` and every pod it starts; `up_args`:
        `pdserve up` flags beyond the ones every test uses."""
        self.port, self.metrics_port = free_port_bases(2)
        self.log_dir = log_dir
        command = [
            sys.executable,
            "-m",
            "pdserve",
            "up",
            "--netns",
            "--model",
            str(model_dir),
            "--port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
            "--http-port",
            str(self.port + 1),
            "--log-dir",
            str(log_dir),
            "--drain-grace-seconds",
            str(drain_grace_s),
            *up_args,
            "--",
            *WORKER_ARGS,
        ]
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    @property
    def prefix(self) -> str:
        return f"pds{self.port}"

    def wait_ready(self, timeout_s: float = 300) -> str:
        """The router's address, once `pdserve up` says it is ready."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.lines:
                if line.startswith(READY):
                    return line.removeprefix(READY).split()[0]
            if self.process.poll() is not None:
                raise RuntimeError("pdserve up --netns exited:\n" + self.output())
            time.sleep(0.2)
        raise TimeoutError("pdserve up --netns not ready:\n" + self.output())

    def http_url(self) -> str:
        line = next(line for line in self.lines if HTTP in line)
        return line.split(HTTP)[1].strip()

    def scale(self, **counts: int) -> dict[str, Any]:
        """`pdserve scale --port P --TIER N ... --json`: the status once the counts are reached."""
        flags = [f"--{tier}={count}" for tier, count in counts.items()]
        done = subprocess.run(
            [sys.executable, "-m", "pdserve", "scale", "--port", str(self.port), "--json", *flags],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        status: dict[str, Any] = json.loads(done.stdout)
        return status

    def stop(self) -> int:
        """Ctrl-C; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=120)
        self._reader.join(timeout=5)
        return code

    def router_warnings(self, last: int = 20) -> list[str]:
        """The router's last warnings (what a failed test shows of why)."""
        lines = (self.log_dir / "router-0.log").read_text(errors="replace").splitlines()
        return [line[:300] for line in lines if " WARNING " in line][-last:]

    def output(self) -> str:
        return "\n".join(self.lines[-60:])


def set_pod_link(namespace: str, up: bool) -> None:
    """Cuts a pod off (its eth0 down: whatever it sends or is sent is dropped, no reset reaches
    anyone, as when a node is lost or partitioned) or joins it again."""
    state = "up" if up else "down"
    subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", state], check=True)


def namespaces() -> list[str]:
    listing = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True)
    return [str(entry["name"]) for entry in json.loads(listing.stdout or "[]")]


def link_exists(name: str) -> bool:
    shown = subprocess.run(["ip", "link", "show", name], capture_output=True)
    return shown.returncode == 0


def received_bytes(namespace: str, interface: str = "eth0") -> int:
    """Bytes received on a pod's interface since it was made."""
    shown = subprocess.run(
        ["ip", "-n", namespace, "-j", "-s", "link", "show", interface],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(shown.stdout)[0]["stats64"]["rx"]["bytes"])


def cpu_cgroup(pid: int) -> str:
    """The process's group in the v1 `cpu` hierarchy (`/` when in none of its own)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return "/"


def pod_pids(namespace: str) -> list[int]:
    listed = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=True
    )
    return [int(pid) for pid in listed.stdout.split()]


class Autoscale:
    """`pdserve autoscale` on a `pdserve up --netns`, as a user runs it beside the cluster; its
    JSON lines (one per interval) are read as they come."""

    def __init__(self, up: NetnsUp, router: str, flags: tuple[str, ...]) -> None:
        """`flags`: beyond the router's metrics URL (--port or --export-port among them)."""
        host = router.rsplit(":", 1)[0]
        command = [sys.executable, "-m", "pdserve", "autoscale"]
        command += ["--metrics-url", f"http://{host}:{up.metrics_port}/metrics", *flags]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._started = time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self.other_lines: list[str] = []  # what it said beside its rows (errors)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                row = json.loads(line)
                row["read_at"] = time.monotonic() - self._started  # when the test saw it
                self.rows.append(row)
            else:
                self.other_lines.append(line.rstrip())

    def wait_for(self, action: str, shape: str, timeout_s: float) -> dict[str, Any]:
        """The first row that took `action` and left the cluster at `shape`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for row in list(self.rows):
                if row["action"] == action and row["shape"] == shape:
                    return row
            assert self.process.poll() is None, self.other_lines[-20:]
            time.sleep(0.2)
        rows = "\n".join(_decision_line(row) for row in self.rows)
        said = "\n".join(self.other_lines[-20:])
        raise AssertionError(
            f"no {action} to {shape} in {timeout_s:.0f} s; its decisions:\n{rows}\n"
            f"beside them:\n{said}"
        )

    def stop(self, timeout_s: float = 60.0) -> int:
        """Ctrl-C; its exit code (one still running after `timeout_s` is killed: left running, it
        would go on scaling the cluster the next tests use)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"pdserve autoscale ignored Ctrl-C for {timeout_s:.0f} s"
            ) from None
        self._reader.join(timeout=5)
        return code


def _decision_line(row: dict[str, Any]) -> str:
    """One decision in a line (its rows carry histograms too long to read in a failure)."""
    seen, newest = row["seen"], row["newest"]
    return (
        f"at {row['read_at']:7.1f} s {row['action']:>14} -> {row['shape']} wanted {row['wanted']}"
        f" (upper {row['wanted_upper']}, floor {row['floor']}) rate {row['rate']}"
        f" in flight {row['in_flight']}; seen {seen['arrivals']:.0f} in {seen['seconds']} s,"
        f" newest {newest['arrivals']:.0f} in {newest['seconds']} s; left {row['departures']}"
    )
