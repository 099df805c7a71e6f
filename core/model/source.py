"""Where a model folder comes from: a path the user gives, or the embedded default."""

from __future__ import annotations

from pathlib import Path

from pdserve.core.model.prepare import ensure_default_model

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "pdserve" / "models"


def resolve_model(model: str | Path | None, cache_dir: Path | None = None) -> Path:
    """The model folder to load: `model` itself, or the default prepared under `cache_dir`."""
    if model is None:
        return ensure_default_model(cache_dir or DEFAULT_CACHE_DIR)
    path = Path(model)
    if not path.is_dir():
        raise FileNotFoundError(f"model: {path} is not a folder (a local Hugging Face model)")
    return path
