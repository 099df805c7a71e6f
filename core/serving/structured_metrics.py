"""Prometheus counters of a worker's structured outputs (names in docs/contract.md), read at scrape
time from its engine's `Grammars`: requests constrained, grammars compiled and the time it took
(on the compile threads), rows masked and the time masking took on the engine thread (divide by
the steps for the per-step overhead)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from pdserve.core.structured.grammar import Grammars


class StructuredCollector(Collector):
    def __init__(self, tier: str, grammars: Grammars) -> None:
        self._prefix = f"pdserve_{tier}_structured"
        self._grammars = grammars

    def collect(self) -> Iterator[CounterMetricFamily]:
        grammars = self._grammars
        for name, documentation, value in (
            ("requests", "Requests (samples) generated under a constraint", grammars.num_requests),
            (
                "compiles",
                "Constraints compiled (the rest came from the cache)",
                grammars.num_compiles,
            ),
            ("compile_seconds", "Time spent compiling constraints", grammars.compile_seconds),
            ("masked_rows", "Logits rows masked by a grammar", grammars.num_masked_rows),
            (
                "mask_seconds",
                "Engine-thread time filling and applying masks",
                grammars.mask_seconds,
            ),
        ):
            yield CounterMetricFamily(f"{self._prefix}_{name}", documentation, value=value)


def register_structured_metrics(tier: str, grammars: Grammars) -> None:
    REGISTRY.register(StructuredCollector(tier, grammars))
