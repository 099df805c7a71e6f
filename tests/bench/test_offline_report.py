"""Ratios, summaries and the plot, from runs with known numbers (no model)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pdserve.bench.offline.engines import EngineKind, EngineRun
from pdserve.bench.offline.report import plot, ratio_table, summarize


def _run(engine: EngineKind, max_batch: int, seconds: float, repeat: int = 0) -> EngineRun:
    return EngineRun(engine, max_batch, repeat, 4, 100, seconds, 2 * seconds, load_seconds=1.0)


RUNS = [
    _run(EngineKind.CONTINUOUS, 16, 1.0),
    _run(EngineKind.CONTINUOUS, 16, 0.5, repeat=1),
    _run(EngineKind.STATIC, 16, 2.0),
    _run(EngineKind.HF, 16, 4.0),
    _run(EngineKind.CONTINUOUS, 4, 2.0),
]


def test_summaries_average_the_repeats_and_measure_their_spread() -> None:
    summaries = {(s.engine, s.max_batch): s for s in summarize(RUNS)}
    continuous = summaries[EngineKind.CONTINUOUS, 16]
    assert continuous.tokens_per_s == (100.0, 200.0)
    assert continuous.mean == pytest.approx(150.0)
    assert continuous.spread_pct == pytest.approx(100 * 100 / 150)


def test_ratios_are_taken_at_the_same_max_batch() -> None:
    table = ratio_table(summarize(RUNS))
    assert "B=16  continuous/static: 3.00x" in table
    assert "B=16  continuous/hf: 6.00x" in table
    assert "B=16  static/hf: 2.00x" in table
    assert "B=4" not in table  # nothing to compare continuous with at B=4


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "sweep.png"
    plot(summarize(RUNS), path, "test")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert width > 100 and height > 100
