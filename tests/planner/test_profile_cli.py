"""`pdserve profile`'s flags refused before anything is measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdserve.cli import main


@pytest.mark.parametrize("bursts", ["4", "4,4"])
def test_serving_bursts_need_two_sizes(
    bursts: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "profile.json"
    code = main(["profile", "--serving", "--bursts", bursts, "--out", str(out)])
    assert code == 2 and not out.exists()
    assert "--bursts: two or more sizes" in capsys.readouterr().err


def test_serving_bursts_are_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["profile", "--serving", "--bursts", "0,4", "--out", "unused.json"])
    assert "--bursts" in capsys.readouterr().err
