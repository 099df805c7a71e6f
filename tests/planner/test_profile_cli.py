"""`pdserve profile`'s flags refused before anything is measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.cli import main


@pytest.mark.parametrize("bursts", ["4", "4,4", "0,4", "1,x"])
def test_serving_bursts_need_two_sizes(
    bursts: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "profile.json"
    code = main(["profile", "--serving", "--bursts", bursts, "--out", str(out)])
    assert code == 2 and not out.exists()
    assert "--bursts: two or more sizes" in capsys.readouterr().err
