"""When each request may start: ghz's constant rate, or Poisson arrivals at the same mean rate.

Poisson (a pdserve extension of ghz's `load-schedule` key) is how serving benchmarks model
independent users (vLLM's benchmark_serving, DistServe): exponential gaps, so bursts and lulls
happen as they do in production. The gaps come from a seed (`POISSON_SEED` unless the config sets
another), so every run of one config (and every arm of a side-by-side benchmark) sees the very
same arrival times.
"""

from __future__ import annotations

import random
from enum import Enum

POISSON_SEED = 0


class LoadSchedule(Enum):
    CONST = "const"  # request i at (i + 1) / rps (ghz's const schedule)
    POISSON = "poisson"  # exponential gaps with mean 1 / rps


class ArrivalSchedule:
    def __init__(
        self, rps: float, kind: LoadSchedule = LoadSchedule.CONST, seed: int = POISSON_SEED
    ) -> None:
        self._rps = rps
        self._kind = kind
        self._random = random.Random(seed)
        self._offsets = [0.0]  # Poisson arrival times drawn so far (the first at once)

    def offset(self, number: int) -> float | None:
        """Seconds after the run's start when request `number` may start (None: no rate)."""
        if self._rps <= 0:
            return None
        if self._kind is LoadSchedule.CONST:
            # ghz's ConstantPacer waits one interval before its first call, so a timed run makes
            # floor(rps * duration) calls, not one more.
            return (number + 1) / self._rps
        while len(self._offsets) <= number:
            self._offsets.append(self._offsets[-1] + self._random.expovariate(self._rps))
        return self._offsets[number]
