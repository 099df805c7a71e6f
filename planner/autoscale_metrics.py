"""What `pdserve autoscale` reads each interval: two scrapes of the routers' /metrics turned into
an `Observation` (the streams admitted between them and their prompt lengths, the output
lengths of those that finished, the streams in flight at the second, and each tier's workers'
recent steps and prompt tokens still to compute as the second saw them). Arrivals are counted
as the router admits them, not as they finish: finishes lag arrivals exactly when the deployment
is short, and an autoscaler reading them sees no more load than the pods it has already serve.
Output lengths are known only at the end: an interval in which none finished takes those of
every request finished so far.

Every address the URL's host resolves to is scraped: on Kubernetes the router's headless
Service names every router pod, and replicas share no state, so the interval's load is the sum of
what each saw (a Service address would hand each scrape to any one router, and the deltas of two
different routers' counters mean nothing). Each worker's steps are reported by every router that
polls it: one copy is kept."""

from __future__ import annotations

import math
import socket
import urllib.parse
import urllib.request
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from pdserve.costmodel.correction import StepPhase, StepWindow
from pdserve.costmodel.step_shape import StepShape
from pdserve.planner.autoscale_observation import LengthHistogram, Observation
from pdserve.planner.autoscale_view import LoadViews

PROMPT_TOKENS = "pdserve_router_admitted_prompt_tokens"
OUTPUT_TOKENS = "pdserve_router_output_tokens"
IN_FLIGHT = "pdserve_router_requests_in_flight"
STEP_WINDOW = "pdserve_router_step_window"  # router/step_gauges.py
PENDING = "pdserve_router_worker_pending_prompt_tokens"  # likewise
WORKERS = "pdserve_router_workers"

WindowKey = tuple[str, str, str]  # tier, worker, phase


@dataclass(frozen=True)
class Scrape:
    """One router's metrics: each length histogram's cumulative bucket counts by upper bound and
    its sum, the streams in flight, the workers' step windows and how many workers of each tier
    are healthy."""

    at: float  # time.monotonic() of the scrape
    buckets: Mapping[str, Mapping[float, float]]
    sums: Mapping[str, float]  # each length histogram's sum of lengths
    in_flight: int
    step_windows: Mapping[WindowKey, StepWindow]
    healthy_workers: Mapping[str, int]  # by tier
    pending_prompt_tokens: Mapping[tuple[str, str], float]  # by (tier, worker)

    @classmethod
    def parse(cls, text: str, at: float) -> Scrape:
        buckets: dict[str, dict[float, float]] = {PROMPT_TOKENS: {}, OUTPUT_TOKENS: {}}
        sums: dict[str, float] = {}
        in_flight = 0.0
        windows = _WindowGauge()
        healthy: dict[str, int] = {}
        pending: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.removesuffix("_bucket") in buckets and "le" in sample.labels:
                    name = sample.name.removesuffix("_bucket")
                    buckets[name][float(sample.labels["le"])] = sample.value
                elif sample.name.removesuffix("_sum") in buckets:
                    sums[sample.name.removesuffix("_sum")] = sample.value
                elif sample.name == IN_FLIGHT:
                    in_flight = sample.value
                elif sample.name == STEP_WINDOW:
                    windows.add(sample)
                elif sample.name == WORKERS and sample.labels.get("state") == "healthy":
                    healthy[sample.labels["tier"]] = int(sample.value)
                elif sample.name == PENDING:
                    pending[(sample.labels["tier"], sample.labels["worker"])] = sample.value
        return cls(at, buckets, sums, int(in_flight), windows.windows(), healthy, pending)


Routers = Mapping[str, Scrape]  # one scrape per router address, taken together


class _WindowGauge:
    """The step-window gauge's samples, gathered back into one `StepWindow` per worker and
    phase."""

    def __init__(self) -> None:
        self._quantities: dict[WindowKey, dict[str, float]] = defaultdict(dict)

    def add(self, sample: Sample) -> None:
        labels = sample.labels
        key = (labels["tier"], labels["worker"], labels["phase"])
        self._quantities[key][labels["quantity"]] = sample.value

    def windows(self) -> dict[WindowKey, StepWindow]:
        return {
            key: _window(StepPhase(key[2]), quantities)
            for key, quantities in self._quantities.items()
        }


def _window(phase: StepPhase, quantities: Mapping[str, float]) -> StepWindow:
    work = StepShape(
        prefill_tokens=int(quantities.get("prefill_tokens", 0)),
        prefill_pairs=int(quantities.get("prefill_pairs", 0)),
        decode_seqs=int(quantities.get("decode_seqs", 0)),
        decode_context=int(quantities.get("decode_context", 0)),
    )
    return StepWindow(phase, int(quantities.get("steps", 0)), work, quantities.get("seconds", 0.0))


def observation(before: Routers, after: Routers) -> Observation:
    """What happened between two scrapes of the same routers (counters only grow: a router that
    restarted between them, or that the first did not see, reads as the second's counts)."""
    seconds = _seconds(before, after)
    prompts = _summed(_between(before, after, PROMPT_TOKENS))
    arrivals = prompts.total
    if not arrivals:  # none in the window: the lengths so far (its rate's high end is not 0)
        prompts = _summed(_between({}, after, PROMPT_TOKENS))
    outputs = _summed(_between(before, after, OUTPUT_TOKENS))
    if not outputs.total:  # none finished yet in this interval: those finished so far
        outputs = _summed(_between({}, after, OUTPUT_TOKENS))
    return Observation(
        seconds,
        arrivals,
        prompts,
        outputs,
        sum(scrape.in_flight for scrape in after.values()),
        _windows_by_tier(after.values()),
        _pending(after.values()),
    )


class ScrapeWindow:
    """The scrapes of the last `lookback_seconds`: each interval's load is seen over every span
    from one of them to the newest, from the window (`seconds`) up to the whole lookback, and
    planner/autoscale_view.py chooses among them. A decision every interval on a load measured
    over longer: at 0.1 req/s a 10 s interval holds one arrival or none, and its rate swings
    between 0 and 3x the true one (a first trace run scaled up and back down every other
    interval so)."""

    def __init__(self, seconds: float, lookback_seconds: float, first: Routers) -> None:
        self.seconds = seconds
        self.lookback_seconds = max(seconds, lookback_seconds)
        self._scrapes: deque[Routers] = deque([first])

    def add(self, now: Routers) -> LoadViews:
        self._scrapes.append(now)
        while len(self._scrapes) > 2 and _at(now) - _at(self._scrapes[1]) >= self.lookback_seconds:
            self._scrapes.popleft()
        starts = [s for s in list(self._scrapes)[:-1] if _at(now) - _at(s) >= self.seconds]
        starts = starts or [self._scrapes[0]]  # none a window old yet: the oldest
        return LoadViews(tuple(observation(start, now) for start in reversed(starts)))


def _at(routers: Routers) -> float:
    return min(scrape.at for scrape in routers.values())


def healthy_workers(routers: Routers) -> dict[str, int]:
    """Per tier, the most healthy workers any router sees (each router polls every worker)."""
    healthy: dict[str, int] = defaultdict(int)
    for scrape in routers.values():
        for tier, count in scrape.healthy_workers.items():
            healthy[tier] = max(healthy[tier], count)
    return dict(healthy)


def _seconds(before: Routers, after: Routers) -> float:
    return _at(after) - _at(before) if before and after else 0.0


def _between(before: Routers, after: Routers, name: str) -> list[LengthHistogram]:
    return [_histogram_between(before.get(address), now, name) for address, now in after.items()]


def _histogram_between(before: Scrape | None, now: Scrape, name: str) -> LengthHistogram:
    """Histogram `name` between a router's two scrapes (`before` None: since it started)."""
    after = now.buckets[name]
    earlier = {} if before is None else before.buckets[name]
    restarted = any(after.get(bound, 0.0) < count for bound, count in earlier.items())
    base = {} if restarted else earlier
    base_sum = 0.0 if restarted or before is None else before.sums.get(name, 0.0)
    cumulative = [(b, after[b] - base.get(b, 0.0)) for b in sorted(after) if not math.isinf(b)]
    beyond = after.get(math.inf, 0.0) - base.get(math.inf, 0.0)
    counts, below = [], 0.0
    for _, count in cumulative:
        counts.append(count - below)
        below = count
    if counts:  # lengths past the last bound count in the last bucket
        counts[-1] += beyond - below
    lengths_sum = now.sums.get(name)
    if lengths_sum is not None:
        lengths_sum -= base_sum
    return LengthHistogram(tuple(b for b, _ in cumulative), tuple(counts), lengths_sum)


def _summed(histograms: Iterable[LengthHistogram]) -> LengthHistogram:
    """Bucket by bucket (routers of one version share their bounds); the sums too, unknown
    where one router's is."""
    by_bound: dict[float, float] = defaultdict(float)
    sums: list[float | None] = []
    for histogram in histograms:
        sums.append(histogram.lengths_sum)
        for bound, count in zip(histogram.bounds, histogram.counts, strict=True):
            by_bound[bound] += count
    bounds = tuple(sorted(by_bound))
    known = [s for s in sums if s is not None]
    lengths_sum = sum(known) if len(known) == len(sums) else None
    return LengthHistogram(bounds, tuple(by_bound[bound] for bound in bounds), lengths_sum)


def _pending(scrapes: Iterable[Scrape]) -> float:
    """Prompt tokens waiting on every worker, each worker once (every router reports it)."""
    one_each: dict[tuple[str, str], float] = {}
    for scrape in scrapes:
        one_each.update(scrape.pending_prompt_tokens)
    return sum(one_each.values())


def _windows_by_tier(scrapes: Iterable[Scrape]) -> dict[str, tuple[StepWindow, ...]]:
    one_each: dict[WindowKey, StepWindow] = {}
    for scrape in scrapes:
        one_each.update(scrape.step_windows)
    tiers: dict[str, list[StepWindow]] = defaultdict(list)
    for (tier, _, _), window in one_each.items():
        tiers[tier].append(window)
    return {tier: tuple(windows) for tier, windows in tiers.items()}


def scrape(url: str, at: float, timeout_s: float = 5.0) -> dict[str, Scrape]:
    """Every router the URL's host resolves to, by address (one that does not answer is left
    out; none answering raises)."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or 80
    infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    addresses = sorted({str(info[4][0]) for info in infos})
    scrapes: dict[str, Scrape] = {}
    errors: list[OSError] = []
    for address in addresses:
        host = f"[{address}]" if ":" in address else address
        one = parts._replace(netloc=f"{host}:{port}").geturl()
        try:
            with urllib.request.urlopen(one, timeout=timeout_s) as page:
                scrapes[address] = Scrape.parse(page.read().decode(), at)
        except OSError as error:
            errors.append(error)
    if not scrapes:
        raise errors[0] if errors else OSError(f"{parts.hostname} resolves to no address")
    return scrapes
