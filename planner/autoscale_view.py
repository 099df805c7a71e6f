"""Which span of the load a decision sizes for: the whole lookback (minutes) while its arrivals
read as one steady rate, and the newest part of it alone once they show that the rate changed.

One 30 s window is too short a view of a low-rate load: at 0.07 req/s it holds one or two
arrivals, and a window with a single chat prompt in a surge of long ones was sized as if the
surge had ended (a first full trace run scaled prefill in twice during the surge so, and missed
its SLOs there). A long view alone would be late: a busy phase's arrivals would hold the pods for
the whole lookback after it ends. So the lookback is tested for a change of rate: under one
Poisson rate, the newest part's share of the lookback's arrivals is binomial (its share of the
seconds), and a share in either tail says the rate changed there (the quiet after a busy phase:
one arrival in the last 30 s where 15 were due; a jump: 10 where 2 were due). Each newest part
from the window up is tested; the most telling one below the tail, if any, is the view, else the
whole lookback, with many more arrivals and a mix that a lull does not empty. Dynamo's SLA
planner likewise sizes each adjustment from a predictor over past intervals, not one scrape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdserve.planner.autoscale_observation import Observation

# How far back a decision may look (`pdserve autoscale --lookback-seconds`): eight intervals of
# 15 s, some eight arrivals of a 0.07 req/s phase.
LOOKBACK_SECONDS = 120.0
# The chance that a steady rate reads as changed at one decision, per tail, shared among the
# newest parts tested (each gets its share: several looks at one history are several tests).
CHANGED_TAIL = 0.01


@dataclass(frozen=True)
class LoadViews:
    """The load up to one moment over spans of growing length: the window first, the whole
    lookback last (all end at the newest scrape: the streams in flight, backlog and step windows
    are the same)."""

    spans: tuple[Observation, ...]

    def __post_init__(self) -> None:
        if not self.spans:
            raise ValueError("spans: at least one")

    def steady(self) -> Observation:
        """The newest part that shows the rate changed most clearly, else the whole lookback."""
        whole = self.spans[-1]
        parts = [span for span in self.spans[:-1] if 0 < span.seconds < whole.seconds]
        if not parts:
            return whole
        tail, part = min(((_tail(part, whole), part) for part in parts), key=lambda t: t[0])
        return part if tail < CHANGED_TAIL / len(parts) else whole


def _tail(part: Observation, whole: Observation) -> float:
    return rate_tail(round(part.arrivals), round(whole.arrivals), part.seconds / whole.seconds)


def rate_tail(recent: int, total: int, share: float) -> float:
    """How unlikely `recent` of `total` arrivals are in a part that is `share` of the span under
    one steady rate: the smaller binomial tail (the conditional test of two Poisson rates: exact,
    and it needs no rate known beforehand); 1 when there is nothing to compare."""
    if total <= 0 or not 0 < share < 1:
        return 1.0
    at_most = sum(_binomial(k, total, share) for k in range(recent + 1))
    at_least = 1 - at_most + _binomial(recent, total, share)
    return min(at_most, at_least)


def _binomial(k: int, n: int, p: float) -> float:
    log = (
        math.lgamma(n + 1)
        - math.lgamma(k + 1)
        - math.lgamma(n - k + 1)
        + k * math.log(p)
        + (n - k) * math.log1p(-p)
    )
    return math.exp(log)
