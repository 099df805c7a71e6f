"""Session-wide fixtures: the real default model, prepared once into the user cache."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from pdserve.core.model_source import resolve_model

    return resolve_model(None)
