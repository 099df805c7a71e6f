"""planner/autoscale_metrics.py: two scrapes of the router's exposition text (written here by
prometheus_client with the router's own metric names and buckets) become the interval's
observation; a router restart between them does not read as negative counts."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Gauge, Histogram, generate_latest

from pdserve.planner.autoscale import LengthHistogram
from pdserve.planner.autoscale_metrics import (
    IN_FLIGHT,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    Scrape,
    observation,
)
from pdserve.router import metrics as router_metrics

BOUNDS = tuple(float(2**i) for i in range(17))


class FakeRouterMetrics:
    """The router's length histograms and in-flight gauge in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.prompts = Histogram(PROMPT_TOKENS, "", buckets=BOUNDS, registry=self.registry)
        self.outputs = Histogram(OUTPUT_TOKENS, "", buckets=BOUNDS, registry=self.registry)
        self.in_flight = Gauge(IN_FLIGHT, "", registry=self.registry)

    def finish(self, prompt: int, output: int, count: int = 1) -> None:
        for _ in range(count):
            self.prompts.observe(prompt)
            self.outputs.observe(output)

    def scrape(self, at: float) -> Scrape:
        return Scrape.parse(generate_latest(self.registry).decode(), at)


def _by_bound(histogram: LengthHistogram) -> dict[float, float]:
    pairs = zip(histogram.bounds, histogram.counts, strict=True)
    return {bound: count for bound, count in pairs if count}


def test_the_names_read_are_the_routers() -> None:
    assert router_metrics.PROMPT_TOKENS is not None  # registered on import
    for name in (f"{PROMPT_TOKENS}_count", f"{OUTPUT_TOKENS}_count", IN_FLIGHT):
        assert REGISTRY.get_sample_value(name) is not None, name


def test_the_interval_counts_only_what_finished_between_the_scrapes() -> None:
    router = FakeRouterMetrics()
    router.finish(prompt=50, output=20, count=7)  # before the interval
    before = router.scrape(at=100.0)
    router.finish(prompt=50, output=20, count=3)
    router.finish(prompt=1000, output=200, count=1)
    router.finish(prompt=200_000, output=5, count=1)  # past the last bound: the last bucket
    router.in_flight.set(6)
    seen = observation(before, router.scrape(at=110.0))
    assert seen.seconds == 10.0 and seen.arrivals == 5 and seen.rate == 0.5
    assert seen.in_flight == 6
    assert _by_bound(seen.prompt_tokens) == {64.0: 3, 1024.0: 1, 65536.0: 1}
    assert _by_bound(seen.output_tokens) == {8.0: 1, 32.0: 3, 256.0: 1}


def test_a_router_restarted_between_scrapes_counts_from_zero() -> None:
    old = FakeRouterMetrics()
    old.finish(prompt=50, output=20, count=9)
    before = old.scrape(at=0.0)
    restarted = FakeRouterMetrics()
    restarted.finish(prompt=100, output=20, count=2)
    seen = observation(before, restarted.scrape(at=15.0))
    assert seen.arrivals == 2
    assert _by_bound(seen.prompt_tokens) == {128.0: 2}
