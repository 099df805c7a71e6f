"""`pdserve bench migration`: its arguments, prompts and intervals (the runs themselves start
clusters: docs/elasticity.md has their command and figures; tests/chaos/test_migration.py
checks the moves it times)."""

from __future__ import annotations

import argparse
import random

import pytest

from pdserve.bench.migration import cli as migration
from pdserve.bench.migration import harness


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    migration.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_and_lists() -> None:
    args = _parse()
    assert (args.contexts, args.repeats, args.streams) == ([100, 1000, 4000], 3, [1, 4, 8])
    assert args.modes == ["live", "re_prefill", "re_prefill_cold"]
    assert _parse("--contexts", "256,2048", "--streams", "2").contexts == [256, 2048]
    assert _parse("--modes", "live,re_prefill_cold").modes == ["live", "re_prefill_cold"]


def test_an_unknown_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--modes", "live,teleport")
    assert "teleport" in capsys.readouterr().err


def test_a_cold_re_prefill_runs_prefill_without_its_prefix_cache() -> None:
    assert migration.MODES["re_prefill_cold"].prefill_args == ("--no-prefix-cache",)
    assert migration.MODES["re_prefill"].prefill_args == ()
    assert migration.MODES["live"].signal is not migration.MODES["re_prefill"].signal


@pytest.mark.parametrize("flag", ["--contexts", "--streams", "--repeats"])
def test_bad_counts_are_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(flag, "0")
    assert flag in capsys.readouterr().err


def test_prompts_are_ordinary_tokens_and_differ_by_seed() -> None:
    first = harness.random_prompt(random.Random("0-100-0"), 92, 49152)
    second = harness.random_prompt(random.Random("0-100-1"), 92, 49152)
    assert len(first) == 92 and first != second
    assert min(first) >= harness.FIRST_ORDINARY_TOKEN and max(first) < 49152


def test_interval_is_a_student_t_interval_of_the_mean() -> None:
    low, high = migration._interval([1.0, 2.0, 3.0])
    assert (low + high) / 2 == pytest.approx(2.0)
    assert high - low == pytest.approx(2 * 4.30 * 1.0 / 3**0.5)
    assert migration._interval([0.5]) == (0.5, 0.5)


def test_link_rate_needs_netns(capsys: pytest.CaptureFixture[str]) -> None:
    assert migration.run(_parse("--link-rate", "100mbit")) == 2
    assert "--link-rate needs --netns" in capsys.readouterr().err


def test_rows_name_their_link() -> None:
    assert harness.link_name(_parse()) == "loopback"
    assert harness.link_name(_parse("--netns")) == "netns"
    assert harness.link_name(_parse("--netns", "--link-rate", "100mbit")) == "netns 100mbit"


def test_a_link_rate_is_a_tc_rate(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--netns", "--link-rate", "fast")
    assert "--link-rate" in capsys.readouterr().err
