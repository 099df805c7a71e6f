"""What the autoscaler observes of the load: one span of the routers' metrics (arrivals, the
prompt and output length histograms, the streams in flight, the workers' backlog and recent
steps: planner/autoscale_metrics.py reads them) and the range of arrival rates its arrivals allow.
planner/autoscale.py sizes for it; planner/autoscale_view.py chooses which span."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from pdserve.costmodel.correction import StepWindow


@dataclass(frozen=True)
class LengthHistogram:
    """Cumulative-free bucket counts: `counts[i]` requests had a length in
    (`bounds[i - 1]`, `bounds[i]`] (the first bucket from 1), and the lengths' sum (the
    Prometheus histogram's `_sum`; None where unknown)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    lengths_sum: float | None = None

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.counts):
            raise ValueError("bounds, counts: one count per bucket")

    @property
    def total(self) -> float:
        return sum(self.counts)

    def draw(self, rng: random.Random) -> int:
        """A length from the histogram: a bucket by its count, uniform within it, scaled so that
        the draws' mean is the observed one where the sum is known. The router's buckets double
        in width: uniform within them, a trace run's chat outputs of 50-200 tokens were drawn
        9-19 % long on average (most fall low in (128, 256]), and the simulated load with them."""
        (index,) = rng.choices(range(len(self.counts)), weights=self.counts)
        low, high = self._bucket(index)
        return max(1, round(rng.randint(low, high) * self._mean_scale))

    def _bucket(self, index: int) -> tuple[int, int]:
        low = 1 if index == 0 else math.floor(self.bounds[index - 1]) + 1
        return low, max(low, math.floor(self.bounds[index]))

    @cached_property
    def _mean_scale(self) -> float:
        """Observed mean / the mean of uniform draws within the buckets (1 without a sum): once
        per histogram, not per draw (a simulated trace draws hundreds)."""
        buckets = (self._bucket(index) for index in range(len(self.counts)))
        uniform = sum(
            c * (low + high) / 2 for c, (low, high) in zip(self.counts, buckets, strict=True)
        )
        if self.lengths_sum is None or self.lengths_sum <= 0 or uniform <= 0:
            return 1.0
        return self.lengths_sum / uniform


@dataclass(frozen=True)
class Observation:
    """One interval of the router's metrics (deltas over `seconds`)."""

    seconds: float
    arrivals: float  # streams admitted in the interval: the rate's numerator
    prompt_tokens: LengthHistogram
    output_tokens: LengthHistogram
    in_flight: int  # streams running at its end
    # Each tier's workers' recent steps, as the router last heard them ("prefill"/"decode" ->
    # every worker's windows; none: the profile stays uncorrected).
    step_windows: Mapping[str, tuple[StepWindow, ...]] = field(default_factory=dict)
    # Prompt tokens accepted by the workers and not yet computed at its end: a backlog that the
    # arrival rate alone does not show (at 0.07 req/s a 30 s window holds one or two arrivals
    # while long prompts queue for half a minute).
    pending_prompt_tokens: float = 0.0

    @property
    def rate(self) -> float:
        return self.arrivals / self.seconds if self.seconds > 0 else 0.0

    @property
    def rate_upper(self) -> float:
        """The highest rate the window's arrivals allow at one-sided 95 %; 0 for an idle window
        (no arrival, no stream, no backlog: the load is over, whatever a rate could still be)."""
        if self.idle or self.seconds <= 0:
            return 0.0
        return poisson_upper(self.arrivals) / self.seconds

    @property
    def rate_lower(self) -> float:
        """The lowest rate the window's arrivals allow at one-sided 95 % (0 with none)."""
        return poisson_lower(self.arrivals) / self.seconds if self.seconds > 0 else 0.0

    @property
    def idle(self) -> bool:
        return not self.arrivals and not self.in_flight and not self.pending_prompt_tokens


# One-sided 95 %: the normal quantile (Wilson and Hilferty's cube-root approximation of the Poisson
# bounds: the upper within 1 % of the exact chi-square one from 0 events on, the lower within 3 %
# from 2 on and 22 % low at 1; no scipy for two numbers).
UPPER_Z = 1.6449


def poisson_upper(events: float) -> float:
    """The largest Poisson mean under which seeing at most `events` has 5 % probability or more
    (0 events: 3.0; 10: 17.0)."""
    n = events + 1
    return n * (1 - 1 / (9 * n) + UPPER_Z / (3 * math.sqrt(n))) ** 3


def poisson_lower(events: float) -> float:
    """The smallest Poisson mean under which seeing at least `events` has 5 % probability or
    more (0 events: 0; 1: 0.05, 0.04 here; 16: 10.0)."""
    if events <= 0:
        return 0.0
    return events * (1 - 1 / (9 * events) - UPPER_Z / (3 * math.sqrt(events))) ** 3
