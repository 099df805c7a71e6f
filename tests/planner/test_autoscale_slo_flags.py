"""`pdserve autoscale`'s SLO flags: by percentiles, or per request as the benchmarks score them;
one form, with what it needs, or an error naming the flags."""

from __future__ import annotations

import argparse

import pytest

from pdserve.planner.autoscale_cli import add_arguments, slo_from_args
from pdserve.planner.plan import PerRequestSlo, Slo

REQUIRED = ("--metrics-url", "http://router:9100/metrics", "--profile", "p.json", "--port", "1")


def _slo(*flags: str) -> Slo:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return slo_from_args(parser.parse_args([*REQUIRED, *flags]))


def test_percentiles_are_the_default_form() -> None:
    assert _slo("--slo-ttft-p90", "2", "--slo-itl-p99", "0.5") == Slo(2.0, 0.5)


def test_per_request_slos_carry_the_per_token_term_and_the_target() -> None:
    slo = _slo(
        *("--slo-attainment", "0.95", "--slo-ttft", "1.5"),
        *("--slo-ttft-per-token", "0.008", "--slo-tpot", "0.3"),
    )
    assert slo.per_request == PerRequestSlo(1.5, 0.008, 0.3, 0.95)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ((), "--slo-ttft-p90"),
        (("--slo-ttft-p90", "2"), "--slo-itl-p99"),
        (("--slo-attainment", "0.9", "--slo-ttft", "1"), "--slo-tpot"),
        (("--slo-attainment", "0.9", "--slo-ttft-p90", "2"), "one form"),
        (("--slo-attainment", "1.5", "--slo-ttft", "1", "--slo-tpot", "0.3"), "(0, 1]"),
    ],
)
def test_an_incomplete_or_mixed_slo_names_its_flags(flags: tuple[str, ...], named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace("]", r"\]")):
        _slo(*flags)
