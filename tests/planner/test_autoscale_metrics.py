"""planner/autoscale_metrics.py: two scrapes of the router's exposition text (written here by
prometheus_client with the router's own metric names and buckets) become the interval's
observation; a router restart between them does not read as negative counts; the workers' step
windows come back as the router exported them."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Gauge, Histogram, generate_latest

from pdserve.core.serving.step_window_proto import step_windows_to_proto
from pdserve.costmodel.correction import StepPhase, StepWindow
from pdserve.costmodel.step_shape import StepShape
from pdserve.planner.autoscale_metrics import (
    IN_FLIGHT,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    Scrape,
    ScrapeWindow,
    observation,
)
from pdserve.planner.autoscale_observation import LengthHistogram, Observation
from pdserve.router import metrics as router_metrics
from pdserve.router import step_gauges
from pdserve.v1 import common_pb2

BOUNDS = tuple(float(2**i) for i in range(17))


class FakeRouterMetrics:
    """The router's length histograms and in-flight gauge in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.prompts = Histogram(PROMPT_TOKENS, "", buckets=BOUNDS, registry=self.registry)
        self.outputs = Histogram(OUTPUT_TOKENS, "", buckets=BOUNDS, registry=self.registry)
        self.in_flight = Gauge(IN_FLIGHT, "", registry=self.registry)

    def finish(self, prompt: int, output: int, count: int = 1) -> None:
        """`count` requests admitted and finished."""
        for _ in range(count):
            self.admit(prompt)
            self.outputs.observe(output)

    def admit(self, prompt: int) -> None:
        self.prompts.observe(prompt)

    def scrape(self, at: float) -> Scrape:
        return Scrape.parse(generate_latest(self.registry).decode(), at)

    def scrapes(self, at: float) -> dict[str, Scrape]:
        """As `scrape` reads one router."""
        return {"10.0.0.1": self.scrape(at)}


def _by_bound(histogram: LengthHistogram) -> dict[float, float]:
    pairs = zip(histogram.bounds, histogram.counts, strict=True)
    return {bound: count for bound, count in pairs if count}


def test_the_names_read_are_the_routers() -> None:
    assert router_metrics.ADMITTED_PROMPT_TOKENS is not None  # registered on import
    for name in (f"{PROMPT_TOKENS}_count", f"{OUTPUT_TOKENS}_count", IN_FLIGHT):
        assert REGISTRY.get_sample_value(name) is not None, name


def test_the_interval_counts_only_what_arrived_between_the_scrapes() -> None:
    router = FakeRouterMetrics()
    router.finish(prompt=50, output=20, count=7)  # before the interval
    before = router.scrapes(at=100.0)
    router.finish(prompt=50, output=20, count=3)
    router.finish(prompt=1000, output=200, count=1)
    router.finish(prompt=200_000, output=5, count=1)  # past the last bound: the last bucket
    router.in_flight.set(6)
    seen = observation(before, router.scrapes(at=110.0))
    assert seen.seconds == 10.0 and seen.arrivals == 5 and seen.rate == 0.5
    assert seen.in_flight == 6
    assert _by_bound(seen.prompt_tokens) == {64.0: 3, 1024.0: 1, 65536.0: 1}
    assert _by_bound(seen.output_tokens) == {8.0: 1, 32.0: 3, 256.0: 1}
    assert seen.prompt_tokens.lengths_sum == 3 * 50 + 1000 + 200_000  # the interval's only
    assert seen.output_tokens.lengths_sum == 3 * 20 + 200 + 5


def test_a_window_without_arrivals_keeps_the_lengths_seen_so_far() -> None:
    """No arrival in the window: the rate is 0, but its high end is not, and the autoscaler
    sizes for it with the lengths the router saw before (planner/autoscale.py)."""
    router = FakeRouterMetrics()
    router.finish(prompt=1000, output=20, count=2)
    before = router.scrapes(at=100.0)
    router.in_flight.set(1)
    seen = observation(before, router.scrapes(at=130.0))
    assert seen.arrivals == 0 and seen.rate == 0.0 and seen.rate_upper > 0.09
    assert _by_bound(seen.prompt_tokens) == {1024.0: 2}


def test_a_router_restarted_between_scrapes_counts_from_zero() -> None:
    old = FakeRouterMetrics()
    old.finish(prompt=50, output=20, count=9)
    before = old.scrapes(at=0.0)
    restarted = FakeRouterMetrics()
    restarted.finish(prompt=100, output=20, count=2)
    seen = observation(before, restarted.scrapes(at=15.0))
    assert seen.arrivals == 2
    assert _by_bound(seen.prompt_tokens) == {128.0: 2}


def test_each_tiers_step_windows_are_read_back_from_the_routers_gauge() -> None:
    """The router's own export (router/step_gauges.py, on its global registry) read back."""
    decode = StepWindow(StepPhase.DECODE, 32, StepShape(decode_seqs=96, decode_context=9000), 1.5)
    mixed = StepWindow(
        StepPhase.MIXED, 5, StepShape(prefill_tokens=700, prefill_pairs=9, decode_seqs=3), 0.4
    )
    prefill = StepWindow(
        StepPhase.PREFILL, 7, StepShape(prefill_tokens=3000, prefill_pairs=10**6), 2.0
    )
    reports = {
        ("decode", "10.0.0.2:1"): [decode, mixed],
        ("decode", "10.0.0.3:1"): [decode],
        ("prefill", "10.0.0.4:1"): [prefill],
    }
    for (tier, worker), windows in reports.items():
        report = common_pb2.LoadResponse(
            step_windows=step_windows_to_proto(windows),
            num_pending_prompt_tokens=1500 if tier == "prefill" else 10,
        )
        step_gauges.export(None, tier, worker, report)
    try:
        seen = _windows_by_tier()
        assert sorted(seen["decode"], key=str) == sorted([decode, mixed, decode], key=str)
        assert seen["prefill"] == (prefill,)
        assert _seen().pending_prompt_tokens == 1520  # each worker once, both routers report it
        step_gauges.export(None, "decode", "10.0.0.2:1", common_pb2.LoadResponse())
        assert _windows_by_tier()["decode"] == (decode,)  # a phase gone is gone from the gauge
    finally:
        for tier, worker in reports:
            step_gauges.forget(tier, worker)
    assert not _windows_by_tier() and not _seen().pending_prompt_tokens


def _windows_by_tier() -> Mapping[str, tuple[StepWindow, ...]]:
    return _seen().step_windows


def _seen() -> Observation:
    """The router's registry, scraped twice (two routers that poll the same workers)."""
    text = generate_latest(REGISTRY).decode()
    routers = {"10.0.0.1": Scrape.parse(text, at=0.0), "10.0.0.9": Scrape.parse(text, at=0.0)}
    return observation(routers, routers)


def test_router_replicas_are_summed_and_one_new_since_the_last_scrape_counts_from_zero() -> None:
    first, second = FakeRouterMetrics(), FakeRouterMetrics()
    first.finish(prompt=50, output=20, count=4)
    before = {"10.0.0.1": first.scrape(at=0.0)}
    first.finish(prompt=50, output=20, count=2)
    second.finish(prompt=1000, output=20, count=3)  # a replica that came up meanwhile
    first.in_flight.set(2)
    second.in_flight.set(5)
    seen = observation(before, {"10.0.0.1": first.scrape(10.0), "10.0.0.2": second.scrape(10.0)})
    assert seen.arrivals == 5 and seen.rate == 0.5 and seen.in_flight == 7
    assert _by_bound(seen.prompt_tokens) == {64.0: 2, 1024.0: 3}


def test_arrivals_count_before_they_finish_and_outputs_fall_back_to_all_finished() -> None:
    """Under overload requests arrive faster than they finish: the rate is the arrivals'."""
    router = FakeRouterMetrics()
    router.finish(prompt=50, output=100, count=2)
    before = router.scrapes(at=0.0)
    for _ in range(6):
        router.admit(prompt=50)  # none of them finished yet
    seen = observation(before, router.scrapes(at=3.0))
    assert seen.arrivals == 6 and seen.rate == 2.0
    assert _by_bound(seen.output_tokens) == {128.0: 2}  # the two finished before


def test_each_decision_sees_the_load_over_spans_from_the_window_to_the_lookback() -> None:
    router = FakeRouterMetrics()
    window = ScrapeWindow(30.0, 60.0, router.scrapes(at=0.0))
    seen = []
    for at in (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0):
        router.finish(prompt=50, output=20, count=1 if at == 10.0 else 0)
        seen.append(window.add(router.scrapes(at)))
    spans = [[(s.seconds, s.arrivals) for s in views.spans] for views in seen]
    assert spans[:3] == [[(10.0, 1)], [(20.0, 1)], [(30.0, 1)]]  # none a window old yet
    assert spans[3] == [(30.0, 0), (40.0, 1)]  # the arrival before 10 s
    assert spans[5] == [(30.0, 0), (40.0, 0), (50.0, 0), (60.0, 1)]
    assert spans[7] == [(30.0, 0), (40.0, 0), (50.0, 0), (60.0, 0)]  # 60 s: the lookback
