"""One arm of `pdserve bench autoscale` as a user runs it: `pdserve up --netns` with CPU-limited
pods (its own process), `pdserve autoscale --port` beside it for the autoscaling arm, and a
sampler that records, once a second, the pods each tier has ready (through the same control
endpoint `pdserve scale` calls) and the streams the router moved with their KV."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.local.scale_control import request_scale
from pdserve.planner.autoscale import Shape

READY = "ready: pdserve.v1.Generation on "
ROUTER_PORT = 50700  # apart from the other benchmarks' ports; arms run one at a time
METRICS_PORT = 50750
DRAIN_GRACE_S = 60.0
MIGRATED_LIVE = 'pdserve_router_migrations_total{outcome="live"}'
SAMPLE_EVERY_S = 1.0


@dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    shape: Shape  # pods ready per tier
    migrated: float  # streams moved live so far (the router's counter)


@dataclass(frozen=True)
class ScaleRow:
    at: float
    row: dict[str, Any]  # one line of `pdserve autoscale`


class Up:
    """`pdserve up --netns` at `shape` (prefill 0: colocated), stopped with Ctrl-C."""

    def __init__(
        self, model_dir: Path, shape: Shape, pod_cpus: float, log_dir: Path | None
    ) -> None:
        command = [sys.executable, "-m", "pdserve", "up", "--netns", "--model", str(model_dir)]
        command += ["--prefill", str(shape.prefill), "--decode", str(shape.decode)]
        command += ["--pod-cpus", str(pod_cpus), "--port", str(ROUTER_PORT)]
        command += ["--metrics-port", str(METRICS_PORT), "--http-port", "0"]
        command += ["--drain-grace-seconds", str(DRAIN_GRACE_S)]
        if log_dir is not None:
            command += ["--log-dir", str(log_dir)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())

    def wait_ready(self, timeout_s: float = 600.0) -> str:
        """The router's address."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.startswith(READY):
                    return line.removeprefix(READY).split()[0]
            if self.process.poll() is not None:
                raise RuntimeError("pdserve up exited:\n" + "\n".join(self.lines[-30:]))
            time.sleep(0.2)
        raise TimeoutError("pdserve up not ready:\n" + "\n".join(self.lines[-30:]))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=300)


class Autoscaler:
    """`pdserve autoscale --port` on the arm's cluster; its rows, stamped as they come."""

    def __init__(self, router: str, flags: tuple[str, ...]) -> None:
        host = router.rsplit(":", 1)[0]
        command = [sys.executable, "-m", "pdserve", "autoscale", "--port", str(ROUTER_PORT)]
        command += ["--metrics-url", f"http://{host}:{METRICS_PORT}/metrics", *flags]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.rows: list[ScaleRow] = []
        self.other_lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.rows.append(ScaleRow(time.monotonic(), json.loads(line)))
            else:
                self.other_lines.append(line.rstrip())

    def stop(self, timeout_s: float = 120.0) -> int:
        """Ctrl-C; its exit code (killed past `timeout_s`: -9)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


class Sampler:
    """Once a second until stopped: the pods ready per tier and the router's live migrations."""

    def __init__(self, router: str) -> None:
        self._metrics_url = f"http://{router.rsplit(':', 1)[0]}:{METRICS_PORT}/metrics"
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = request_scale(ROUTER_PORT, {}, timeout_s=10)
                shape = Shape(status.ready("prefill"), status.ready("decode"))
                self.samples.append(Sample(time.monotonic(), shape, self._migrated()))
            except OSError as error:  # a busy moment: the next sample tries again
                print(f"sampler: {error}", file=sys.stderr)
            self._stop.wait(SAMPLE_EVERY_S)

    def _migrated(self) -> float:
        with urllib.request.urlopen(self._metrics_url, timeout=5) as page:
            for line in page.read().decode().splitlines():
                if line.startswith(MIGRATED_LIVE + " "):
                    return float(line.split()[1])
        return 0.0

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.samples


def require_root() -> str | None:
    """Why pods cannot be made here, or None."""
    return None if os.geteuid() == 0 else "needs root (pdserve up --netns: namespaces, a bridge)"
