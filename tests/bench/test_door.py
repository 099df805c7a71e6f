"""`pdserve bench` is the one door: every benchmark module has a name there; --help lists them."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pdserve.bench
from pdserve.bench.cli import BENCHMARKS


def _runnable_modules() -> set[str]:
    """Modules under pdserve.bench that define the door's protocol (add_arguments and run)."""
    found = set()
    for info in pkgutil.walk_packages(pdserve.bench.__path__, "pdserve.bench."):
        if info.ispkg or info.name == "pdserve.bench.cli":
            continue
        module = importlib.import_module(info.name)
        if callable(getattr(module, "add_arguments", None)) and callable(
            getattr(module, "run", None)
        ):
            found.add(info.name)
    return found


def test_every_benchmark_module_has_a_door() -> None:
    registered = {module for module, _ in BENCHMARKS.values()}
    assert _runnable_modules() == registered


def test_help_lists_every_benchmark() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pdserve", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for name in BENCHMARKS:
        assert f"    {name} " in result.stdout or f"    {name}\n" in result.stdout, name


def test_no_benchmark_module_is_run_as_a_script() -> None:
    """One door: no `python -m pdserve.bench.X` entry points left beside it."""
    for info in pkgutil.walk_packages(pdserve.bench.__path__, "pdserve.bench."):
        source = importlib.import_module(info.name).__loader__.get_source(info.name)  # type: ignore[union-attr]
        assert source is not None
        assert 'if __name__ == "__main__"' not in source, info.name


def test_the_door_imports_no_benchmark_until_one_is_chosen() -> None:
    """`pdserve bench --help` builds every name's parser without importing their modules (torch
    among them); choosing one imports that one."""
    probe = (
        "import sys; from pdserve.cli import build_parser; build_parser(['bench']); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('pdserve.bench.')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['pdserve.bench.cli']"
