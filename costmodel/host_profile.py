"""A profile of this host, measured once and found again: what `pdserve up --placement adaptive`
(or `--itl-slo`) and `pdserve bench disagg` use when no `--profile` is given.

A profile measured elsewhere misleads (costmodel/host.py warns when one is loaded on another
host), and the project cannot ship one for every host. So the first such start on a host measures
one with `pdserve profile` (offline steps; in a process of its own, since it pins itself to one
core), saying so, and keeps it under ~/.cache/pdserve/profiles by a key of what its numbers
depend on: the host's fingerprint, the model's config, the dtype, and the torch and pdserve
versions. Later starts find it. What the key cannot see (a busier machine, an engine changed
without a version bump) the online correction takes up while serving (costmodel/correction.py).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from pdserve.costmodel.host import this_host

PROFILE_CACHE = Path.home() / ".cache" / "pdserve" / "profiles"


def profile_key(model_dir: Path, dtype: str, matmul: str) -> str:
    """What a profile's numbers depend on, hashed; `matmul` names what runs the model's matmuls
    (core/model/gemm.py `cpu_float32_backend`: the caller's, as costmodel sits below core)."""
    config = model_dir / "config.json"
    parts = {
        "matmul": matmul,
        "host": this_host().to_json(),
        "model": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None,
        "dtype": dtype,
        "torch": _version("torch"),
        "pdserve": _version("pdserve"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def host_profile(
    model_dir: Path,
    dtype: str,
    matmul: str,
    cache_dir: Path = PROFILE_CACHE,
    progress: Callable[[str], None] = _to_stderr,
    measure: Callable[[Path, str, Path], None] | None = None,
) -> Path:
    """This host's profile of the model at `dtype`: the cached one, or one measured now (by
    `measure(model_dir, dtype, out)`, default `pdserve profile` in a child process); what it
    does goes to `progress` (default: stderr, so that a caller's stdout, e.g. `--json`, stays
    its own)."""
    path = cache_dir / f"{model_dir.name}-{dtype}-{profile_key(model_dir, dtype, matmul)}.json"
    if path.is_file():
        progress(f"profile: this host's, measured before ({path})")
        return path
    progress(
        "profile: none of this host yet; measuring one with `pdserve profile` (minutes, once; "
        f"kept at {path}) ..."
    )
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")  # a run cut short leaves no profile
    (measure or _pdserve_profile)(model_dir, dtype, partial)
    partial.replace(path)
    progress(f"profile: measured, {path}")
    return path


def _pdserve_profile(model_dir: Path, dtype: str, out: Path) -> None:
    """One repeat of each scenario: on a 2-core AMD EPYC (2026-12-04, quiet) the default two took
    614 s, one 301 s, with coefficients within 1-15 % of the two's (docs/planning.md); the
    online correction tunes what one repeat leaves."""
    command = [sys.executable, "-m", "pdserve", "profile", "--model", str(model_dir)]
    subprocess.run([*command, "--dtype", dtype, "--repeats", "1", "--out", str(out)], check=True)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
