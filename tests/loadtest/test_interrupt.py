"""Ctrl-C while load runs, in a process of its own (tests/loadtest/interrupted.py): `pdserve
loadtest` ends its run with the calls so far, as ghz does; a program running several drives in
one loop (a benchmark's phases) stops, instead of one drive taking the signal for itself while
the others, and the benchmark's pods, went on."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from .conftest import FakeServer

REPO = Path(__file__).resolve().parents[2]
STOPPED_WITHIN_S = 10.0  # every stream asks for 50 s of tokens


def _interrupted(server: FakeServer, mode: str) -> subprocess.CompletedProcess[str]:
    server.servicer.token_delay_s = 0.05
    command = [sys.executable, "-m", "tests.loadtest.interrupted", server.target, mode]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started"
    process.send_signal(signal.SIGINT)
    try:
        out, _ = process.communicate(timeout=STOPPED_WITHIN_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise AssertionError(
            f"{mode}: still running {STOPPED_WITHIN_S:.0f} s after Ctrl-C"
        ) from None
    return subprocess.CompletedProcess(command, process.returncode, out)


def test_ctrl_c_ends_a_loadtest_run_as_cancelled(fake_server: FakeServer) -> None:
    done = _interrupted(fake_server, "loadtest")
    assert done.returncode == 0 and done.stdout.split() == ["cancel"]


def test_ctrl_c_stops_a_program_running_several_drives(fake_server: FakeServer) -> None:
    done = _interrupted(fake_server, "phases")
    assert done.returncode == -signal.SIGINT  # Python's exit on an uncaught KeyboardInterrupt
