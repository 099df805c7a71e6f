"""Reflection's symbol lookup: a method name finds its service's file (ghz asks by method)."""

from __future__ import annotations

import pytest

from pdserve.core.serving.reflection import MethodResolvingPool
from pdserve.v1 import generation_pb2  # noqa: F401  (puts generation.proto in the default pool)

GENERATION_FILE = "pdserve/v1/generation.proto"


@pytest.mark.parametrize(
    "symbol",
    [
        "pdserve.v1.Generation.GenerateStream",  # a method: the default pool alone misses it
        "pdserve.v1.Generation.Generate",
        "pdserve.v1.Generation",
        "pdserve.v1.GenerateRequest",
    ],
)
def test_symbols_find_their_file(symbol: str) -> None:
    assert MethodResolvingPool().FindFileContainingSymbol(symbol).name == GENERATION_FILE


@pytest.mark.parametrize(
    "symbol", ["pdserve.v1.Generation.Nope", "pdserve.v1.Nope.Generate", "Generate", ""]
)
def test_unknown_symbols_stay_unknown(symbol: str) -> None:
    with pytest.raises(KeyError):
        MethodResolvingPool().FindFileContainingSymbol(symbol)


def test_other_lookups_reach_the_pool() -> None:
    pool = MethodResolvingPool()
    assert pool.FindFileByName(GENERATION_FILE).package == "pdserve.v1"
