"""ghz itself against a real cluster (the package's shared one: test_up_and_loadtest.py runs the
runner against `pdserve up`): every shipped config in loadtest/ run by ghz from the repository
root (as docs/loadtest.md tells users), its JSON report read (every call OK, as many calls as
configured), then the same config through `pdserve loadtest` on the same server right after: the
same counts and the same latency percentiles within LATENCY_RATIO. And ghz with no .proto at all,
finding the API by the router's reflection.

ghz is a Go program: ./setup.sh builds it into .tools/bin where Go is installed. Without Go these
tests skip and say so; with Go but without the binary they fail (./setup.sh was not run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pdserve.local.cluster import Cluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GHZ = REPO / ".tools" / "bin" / "ghz"
CONFIGS = sorted((REPO / "loadtest").glob("*.json"))
# Small runs: a config with a total keeps its concurrency and sends SMALL_TOTAL calls; a timed
# config keeps its rate and sends SMALL_RATED_TOTAL calls (`-z 0 -n N`), not a shorter duration:
# at the end of a duration ghz's pacer picks at random between its next tick and the stop signal
# (a Go select), so a timed run makes floor(rps x duration) calls plus a random few.
SMALL_TOTAL = 8  # one wave at the shipped concurrency (8)
SMALL_RATED_TOTAL = 8
# The percentiles compared, and how far apart the two tools' figures may be (larger / smaller).
# Both time the same server back to back, but each run lasts seconds on two cores that other
# processes may share: with other clusters running beside it, runs of the same size came out up to
# 1.8x apart, in either direction. The bound still catches a runner that times something else (a
# stream to its first token is 5-15x shorter here, a unit slip 1000x), not a load swing.
PERCENTILES = (50, 90)
LATENCY_RATIO = 2.0


@pytest.fixture(scope="module")
def ghz() -> Path:
    if GHZ.is_file():
        return GHZ
    if shutil.which("go") is None:
        pytest.skip(
            "ghz cross-check skipped: Go is not installed, so ./setup.sh did not build ghz "
            "into .tools/bin (install Go and re-run ./setup.sh to run it)"
        )
    pytest.fail("Go is installed but .tools/bin/ghz is missing: run ./setup.sh (it builds ghz)")


@pytest.fixture(scope="module")
def server(ghz: Path, cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The shared cluster's router address, warmed up."""
    address = cluster.router.address
    # The first calls after start pay one-off costs; neither tool should measure them.
    _loadtest(CONFIGS[0], ["-n", "8"], address, tmp_path_factory.mktemp("warm-up"))
    return address


@pytest.mark.parametrize("config", CONFIGS, ids=[config.stem for config in CONFIGS])
def test_ghz_runs_the_config_and_the_runner_agrees(
    config: Path, ghz: Path, server: str, tmp_path: Path
) -> None:
    size, expected = _small(config)
    theirs = _ghz(ghz, config, size, server, REPO, tmp_path)
    assert theirs["statusCodeDistribution"] == {"OK": expected}, theirs["errorDistribution"]
    assert theirs["count"] == expected == len(theirs["details"])

    ours = _loadtest(config, size, server, tmp_path)
    assert ours["statusCodeDistribution"] == {"OK": expected}, ours["errorDistribution"]
    assert ours["count"] == expected
    assert set(theirs) <= set(ours)  # ghz's report fields, all of them
    rps = json.loads(config.read_text()).get("rps", 0)
    if rps:  # both paced: the last call started no earlier than count / rps (ghz's const pacer)
        assert min(theirs["total"], ours["total"]) >= expected / rps * 1e9
    for percentage in PERCENTILES:
        ghz_ns, runner_ns = _latency(theirs, percentage), _latency(ours, percentage)
        ratio = max(ghz_ns, runner_ns) / min(ghz_ns, runner_ns)
        assert ratio <= LATENCY_RATIO, (
            f"p{percentage}: ghz {ghz_ns / 1e6:.0f} ms, pdserve loadtest {runner_ns / 1e6:.0f} ms"
        )
    if json.loads(config.read_text())["call"].endswith("Stream"):
        # What ghz cannot say about a stream: when its first token came.
        assert ours["generation"]["timeToFirstToken"]["count"] == expected


@pytest.mark.parametrize("name", ["generate_concurrency.json", "stream_concurrency.json"])
def test_ghz_finds_the_api_by_reflection(name: str, ghz: Path, server: str, tmp_path: Path) -> None:
    raw = json.loads((REPO / "loadtest" / name).read_text())
    del raw["proto"], raw["import-paths"]
    config = tmp_path / name
    config.write_text(json.dumps(raw))
    # Run where no .proto file is: the descriptors can only come from the server.
    report = _ghz(ghz, config, ["-n", "4"], server, tmp_path, tmp_path)
    assert report["statusCodeDistribution"] == {"OK": 4}, report["errorDistribution"]


def _small(config: Path) -> tuple[list[str], int]:
    """The flags that shrink a shipped config (the same for ghz and the runner), and the count."""
    if "duration" in json.loads(config.read_text()):
        return ["-z", "0", "-n", str(SMALL_RATED_TOTAL)], SMALL_RATED_TOTAL
    return ["-n", str(SMALL_TOTAL)], SMALL_TOTAL


def _ghz(
    ghz: Path, config: Path, flags: list[str], address: str, cwd: Path, out_dir: Path
) -> dict[str, Any]:
    report = out_dir / f"{config.stem}.ghz.json"
    command = [str(ghz), "--config", str(config), *flags, "--format", "json"]
    done = subprocess.run(
        [*command, "--output", str(report), address],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = json.loads(report.read_text())
    return loaded


def _loadtest(config: Path, flags: list[str], address: str, out_dir: Path) -> dict[str, Any]:
    report = out_dir / f"{config.stem}.pdserve.json"
    command = [sys.executable, "-m", "pdserve", "loadtest", str(config), *flags, "-q"]
    done = subprocess.run(
        [*command, "--host", address, "--output", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = json.loads(report.read_text())
    return loaded


def _latency(report: dict[str, Any], percentage: int) -> int:
    return next(
        int(mark["latency"])
        for mark in report["latencyDistribution"]
        if mark["percentage"] == percentage
    )
