"""What `pdserve autoscale` reads each interval: two scrapes of the router's /metrics turned into
an `Observation` (the requests that finished between them, their prompt and output length
histograms, the streams in flight at the second)."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from pdserve.planner.autoscale import LengthHistogram, Observation

PROMPT_TOKENS = "pdserve_router_prompt_tokens"
OUTPUT_TOKENS = "pdserve_router_output_tokens"
IN_FLIGHT = "pdserve_router_requests_in_flight"


@dataclass(frozen=True)
class Scrape:
    """One scrape: each length histogram's cumulative bucket counts by upper bound, and the
    streams in flight."""

    at: float  # time.monotonic() of the scrape
    buckets: Mapping[str, Mapping[float, float]]
    in_flight: int

    @classmethod
    def parse(cls, text: str, at: float) -> Scrape:
        buckets: dict[str, dict[float, float]] = {PROMPT_TOKENS: {}, OUTPUT_TOKENS: {}}
        in_flight = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.removesuffix("_bucket") in buckets and "le" in sample.labels:
                    name = sample.name.removesuffix("_bucket")
                    buckets[name][float(sample.labels["le"])] = sample.value
                elif sample.name == IN_FLIGHT:
                    in_flight = sample.value
        return cls(at, buckets, int(in_flight))


def observation(before: Scrape, after: Scrape) -> Observation:
    """What happened between two scrapes of the same router (counters only grow; a router that
    restarted between them reads as the second scrape's counts alone)."""
    prompts = _between(before.buckets[PROMPT_TOKENS], after.buckets[PROMPT_TOKENS])
    outputs = _between(before.buckets[OUTPUT_TOKENS], after.buckets[OUTPUT_TOKENS])
    return Observation(after.at - before.at, prompts.total, prompts, outputs, after.in_flight)


def _between(before: Mapping[float, float], after: Mapping[float, float]) -> LengthHistogram:
    restarted = any(after.get(bound, 0.0) < count for bound, count in before.items())
    base = {} if restarted else before
    cumulative = [(b, after[b] - base.get(b, 0.0)) for b in sorted(after) if not math.isinf(b)]
    beyond = after.get(math.inf, 0.0) - base.get(math.inf, 0.0)
    counts, below = [], 0.0
    for _, count in cumulative:
        counts.append(count - below)
        below = count
    if counts:  # lengths past the last bound count in the last bucket
        counts[-1] += beyond - below
    return LengthHistogram(tuple(b for b, _ in cumulative), tuple(counts))


def scrape(url: str, at: float, timeout_s: float = 5.0) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout_s) as page:
        return Scrape.parse(page.read().decode(), at)
