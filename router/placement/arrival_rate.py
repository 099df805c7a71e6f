"""How many requests a second are being placed now: a count over a sliding window.

Adaptive placement prices the requests expected to arrive while a decode worker prefills a
long prompt (placement/adaptive.py, `blocked`); the router and the planner's simulator keep one
of these each, fed with their own clocks."""

from __future__ import annotations

import collections

WINDOW_S = 60.0  # long enough to hold several requests at the rates two cores serve
MIN_SPAN_S = 10.0  # before that much has passed, a few early requests are not read as a burst


class ArrivalRate:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._times: collections.deque[float] = collections.deque()
        self._first: float | None = None

    def record(self, now: float) -> None:
        if self._first is None:
            self._first = now
        self._times.append(now)
        self._forget_before(now - self._window_s)

    def per_second(self, now: float) -> float:
        """Requests a second over the window (or the time since the first, if shorter)."""
        if self._first is None:
            return 0.0
        self._forget_before(now - self._window_s)
        span = min(self._window_s, max(now - self._first, MIN_SPAN_S))
        return len(self._times) / span

    def _forget_before(self, cutoff: float) -> None:
        while self._times and self._times[0] < cutoff:
            self._times.popleft()
