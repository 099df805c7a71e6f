"""Fixtures shared by the kernel tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pdserve.kernels import cpu_decode, cpu_panel_linear, decode_step, layer_ops
from pdserve.kernels.cpu_extensions import SWITCH


def _forget_loaded_kernels() -> None:
    cpu_decode.kernel.cache_clear()
    cpu_panel_linear.kernel.cache_clear()
    cpu_panel_linear.widest_path_here.cache_clear()
    cpu_panel_linear.default_path_here.cache_clear()
    layer_ops.kernel.cache_clear()
    decode_step.kernel.cache_clear()


@pytest.fixture
def cpu_kernels_off(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`PDSERVE_CPU_KERNELS=off` for one test: every CPU kernel's torch path runs."""
    monkeypatch.setenv(SWITCH, "off")
    _forget_loaded_kernels()
    yield
    monkeypatch.delenv(SWITCH)
    _forget_loaded_kernels()
