"""`pdserve bench pod-cpus`: its arms as the flag spells them, and the two ratios the sizing reads
(the real runs are in docs/elasticity.md: they need root and minutes)."""

from __future__ import annotations

import argparse

import pytest

from pdserve.bench.pods.cpu_limit import Arm, ArmRun, _summary, parse_arms


def test_arms_are_pods_x_cores() -> None:
    assert parse_arms("1x1.0,1x0.5, 2x0.5") == [Arm(1, 1.0), Arm(1, 0.5), Arm(2, 0.5)]
    assert [arm.name for arm in parse_arms("1x1.0,2x0.5")] == ["1x1", "2x0.5"]


@pytest.mark.parametrize("text", ["1", "x0.5", "0x1", "2x0", "1x-1", "ax0.5"])
def test_a_bad_arm_is_refused_with_its_text(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"NxC|N >= 1"):
        parse_arms(text)


def _run(arm: str, tokens_per_s: float, repeat: int = 0) -> ArmRun:
    return ArmRun(arm, repeat, 24, 1536, 1536 / tokens_per_s, tokens_per_s, 0.0)


def test_the_summary_compares_half_pods_with_a_whole_one() -> None:
    runs = [_run("1x1", 60.0), _run("1x0.5", 31.0), _run("2x0.5", 57.0)]
    runs += [_run("1x1", 64.0, 1), _run("1x0.5", 31.0, 1), _run("2x0.5", 61.0, 1)]
    summary = _summary(parse_arms("1x1.0,1x0.5,2x0.5"), runs)
    assert summary["repeats"] == 2
    assert summary["half"] == pytest.approx(31.0 / 62.0)
    assert summary["two_halves"] == pytest.approx(59.0 / 62.0)
    assert "half" not in _summary(parse_arms("1x0.5"), [_run("1x0.5", 31.0)])
