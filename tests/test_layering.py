"""The house's arrows point down (docs/architecture.md): no room imports one above it, and the two
worker tiers do not import each other. Read from the source, imports inside functions included."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {
    name: REPO / folder
    for name, folder in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].items()
}

# room -> rooms it must never import (by `pdserve.` prefix).
FORBIDDEN = {
    "pdserve.costmodel": ("pdserve.core", "pdserve.router", "pdserve.planner", "pdserve.bench"),
    "pdserve.core": (
        "pdserve.router",
        "pdserve.planner",
        "pdserve.prefill_service",
        "pdserve.decode_service",
        "pdserve.bench",
        "pdserve.local",
    ),
    "pdserve.router": (
        "pdserve.planner",
        "pdserve.prefill_service",
        "pdserve.decode_service",
        "pdserve.bench",
    ),
    "pdserve.prefill_service": ("pdserve.decode_service", "pdserve.planner", "pdserve.router"),
    "pdserve.decode_service": ("pdserve.prefill_service", "pdserve.planner", "pdserve.router"),
    "pdserve.planner": ("pdserve.bench",),
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _modules_of(room: str) -> list[Path]:
    if room == "pdserve.local":
        return sorted((REPO / "pdserve" / "local").rglob("*.py"))
    return sorted(FOLDERS[room].rglob("*.py"))


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_no_room_imports_one_above_it(room: str) -> None:
    found = {
        f"{path.relative_to(REPO)} imports {name}"
        for path in _modules_of(room)
        for name in imported_modules(path)
        if name.startswith(FORBIDDEN[room])
    }
    assert not found, sorted(found)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text("def f() -> None:\n    from pdserve.planner import plan\n")
    assert "pdserve.planner.plan" in imported_modules(module)
