"""When each request may start: ghz's constant rate, or Poisson arrivals at the same mean rate.

Poisson (a pdserve extension of ghz's `load-schedule` key) is how serving benchmarks model
independent users (vLLM's benchmark_serving, DistServe): exponential gaps, so bursts and lulls
happen as they do in production. The gaps come from a seed (`POISSON_SEED` unless the config sets
another), so every run of one config (and every arm of a side-by-side benchmark) sees the very
same arrival times.

Poisson within a window (`poisson-window`) is the same process given its count: `total` arrivals
uniformly scattered over total / rps seconds (a Poisson process that had `total` arrivals in
that span has them so), so a fixed number of requests ends with its span. A trace's phase is
such a span: with free exponential gaps its last request lands a random tens of seconds from the
phase's end (a 180-request phase at 0.5 req/s ended 9 s into the next phase, a 36-request one 89 s
early), and the phases a benchmark claims are not the ones it ran.
"""

from __future__ import annotations

import random
from enum import Enum

POISSON_SEED = 0


class LoadSchedule(Enum):
    CONST = "const"  # request i at (i + 1) / rps (ghz's const schedule)
    POISSON = "poisson"  # exponential gaps with mean 1 / rps
    POISSON_WINDOW = "poisson-window"  # `total` arrivals scattered over total / rps seconds


class ArrivalSchedule:
    def __init__(
        self,
        rps: float,
        kind: LoadSchedule = LoadSchedule.CONST,
        seed: int = POISSON_SEED,
        total: int = 0,
    ) -> None:
        """`total`: the number of requests (a `poisson-window` schedule needs it)."""
        self._rps = rps
        self._kind = kind
        self._random = random.Random(seed)
        self._offsets = [0.0]  # Poisson arrival times drawn so far (the first at once)
        if kind is LoadSchedule.POISSON_WINDOW and rps > 0:
            if total <= 0:
                raise ValueError("load-schedule poisson-window: needs a total")
            span = total / rps
            self._offsets = sorted(self._random.uniform(0.0, span) for _ in range(total))

    def offset(self, number: int) -> float | None:
        """Seconds after the run's start when request `number` may start (None: no rate)."""
        if self._rps <= 0:
            return None
        if self._kind is LoadSchedule.CONST:
            # ghz's ConstantPacer waits one interval before its first call, so a timed run makes
            # floor(rps * duration) calls, not one more.
            return (number + 1) / self._rps
        if self._kind is LoadSchedule.POISSON_WINDOW:
            return self._offsets[number]
        while len(self._offsets) <= number:
            self._offsets.append(self._offsets[-1] + self._random.expovariate(self._rps))
        return self._offsets[number]
