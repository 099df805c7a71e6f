"""The built CPU kernel a test module runs, or a skip where this machine cannot build one."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from types import ModuleType

import pytest


def built_kernel(load: Callable[[], ModuleType | None]) -> ModuleType:
    """Skips without a C++ compiler (no kernel is ever built there: torch runs); fails where a
    compiler exists and the kernel is not built (`./setup.sh` builds it)."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler here: the kernel is never built, torch runs")
    module = load()
    assert module is not None, "not built: ./setup.sh builds it"
    return module
