"""This host's profile (costmodel/host_profile.py): measured on first use, found again after,
kept apart per model and dtype, and never left half-written."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.costmodel.host_profile import host_profile, profile_key


def _model(tmp_path: Path, config: str = '{"model_type": "llama"}') -> Path:
    folder = tmp_path / "model"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config)
    return folder


class Measurer:
    def __init__(self) -> None:
        self.runs: list[tuple[str, Path]] = []

    def __call__(self, model_dir: Path, dtype: str, out: Path) -> None:
        self.runs.append((dtype, out))
        out.write_text('{"measured": true}')


def test_the_first_use_measures_and_the_next_finds_it(tmp_path: Path) -> None:
    model, cache, said = _model(tmp_path), tmp_path / "profiles", []
    measure = Measurer()
    first = host_profile(
        model, "float32", "onednn", cache_dir=cache, progress=said.append, measure=measure
    )
    again = host_profile(
        model, "float32", "onednn", cache_dir=cache, progress=said.append, measure=measure
    )
    assert first == again and first.read_text() == '{"measured": true}'
    assert len(measure.runs) == 1 and first.parent == cache
    assert "measuring one" in said[0] and "measured before" in said[-1]


def test_a_profile_is_kept_per_model_and_dtype(tmp_path: Path) -> None:
    model = _model(tmp_path)
    assert profile_key(model, "float32", "onednn") != profile_key(model, "bfloat16", "onednn")
    other = _model(tmp_path / "other", '{"model_type": "qwen2"}')
    assert profile_key(model, "float32", "onednn") != profile_key(other, "float32", "onednn")
    assert profile_key(model, "float32", "onednn") == profile_key(model, "float32", "onednn")


def test_a_profile_is_kept_per_matmul_backend(tmp_path: Path) -> None:
    model = _model(tmp_path)  # packed weights (2026-12-04) made 16-row steps 1.2-1.4x faster
    assert profile_key(model, "float32", "onednn-packed16") != profile_key(
        model, "float32", "onednn"
    )


def test_a_failed_measurement_leaves_no_profile(tmp_path: Path) -> None:
    def fails(model_dir: Path, dtype: str, out: Path) -> None:
        out.write_text("{half")
        raise RuntimeError("profiling died")

    cache = tmp_path / "profiles"
    with pytest.raises(RuntimeError):
        host_profile(
            _model(tmp_path), "float32", "onednn", cache_dir=cache, progress=print, measure=fails
        )
    assert not list(cache.glob("*.json"))
