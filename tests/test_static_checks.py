"""ruff and mypy (strict) are part of the test suite, so CI keeps the code clean.

mypy cannot follow the editable install's import hook (`pdserve.core` lives in core/, ...), so the
test builds a tree of symlinks shaped like the installed package and points MYPYPATH at it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.background import lowest_priority, raise_priority

REPO = Path(__file__).resolve().parent.parent
# pdserve.X -> folder, as pyproject's package-dir maps them (the root package `pdserve` aside).
PACKAGE_DIRS = {
    name.removeprefix("pdserve."): folder
    for name, folder in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].items()
    if name != "pdserve"
}


def _run(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True, env=env
    )


def test_ruff_lint_is_clean() -> None:
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def build_package_tree(root: Path) -> Path:
    """`root/pdserve/...` mirroring pyproject's package-dir mapping, as symlinks."""
    package = root / "pdserve"
    package.mkdir(parents=True)
    for entry in (REPO / "pdserve").iterdir():
        if entry.suffix == ".py" or (entry / "__init__.py").exists():
            (package / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    for name, source in PACKAGE_DIRS.items():
        (package / name).symlink_to(REPO / source, target_is_directory=True)
    return root


@dataclass(frozen=True)
class MypyRun:
    """`mypy -p pdserve` (strict, from pyproject) running in the background."""

    process: subprocess.Popen[str]

    def outcome(self) -> tuple[int, str]:
        """Waits for it: (exit status, what it printed)."""
        raise_priority(self.process.pid)  # the test waits for it now
        out, err = self.process.communicate()
        return self.process.returncode, out[-8000:] + err[-2000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def start_mypy(tree_root: Path) -> MypyRun:
    tree = build_package_tree(tree_root)
    command = [sys.executable, "-m", "mypy", "--cache-dir", str(REPO / ".mypy_cache")]
    process = subprocess.Popen(
        [*command, "-p", "pdserve"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MYPYPATH": str(tree)},
        # Lowest CPU priority: it runs on what the tests leave idle (waits on streams, drains,
        # timeouts) instead of slowing the tests that compute beside it (tests/background.py).
        preexec_fn=lowest_priority,
    )
    return MypyRun(process)


@pytest.mark.slow  # a minute of one core from a cold cache: not in the edit-loop subset
def test_mypy_strict_is_clean(mypy_run: MypyRun) -> None:
    """`mypy_run` (tests/conftest.py) started before the first test of the run."""
    code, printed = mypy_run.outcome()
    assert code == 0, printed
