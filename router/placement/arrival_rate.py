"""How many requests a second are being placed now: a count over a sliding window.

Adaptive placement prices the requests expected to arrive while a decode worker prefills a
long prompt (placement/adaptive.py, `blocked`); the router and the planner's simulator keep one
of these each, fed with their own clocks."""

from __future__ import annotations

import collections

WINDOW_S = 60.0  # long enough to hold several requests at the rates two cores serve
MIN_SPAN_S = 10.0  # a few requests close together are not read as a burst of many a second


class ArrivalRate:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._times: collections.deque[float] = collections.deque()

    def record(self, now: float) -> None:
        self._times.append(now)
        self._forget_before(now - self._window_s)

    def per_second(self, now: float) -> float:
        """The window's requests over the time since the oldest of them: the gaps they span up to
        now. Over the whole window instead, requests that came after a quiet spell read as
        spread over it (3 that came within 39 s read as 0.05 a second, not 0.076:
        docs/disaggregation.md, the chat-heavy mix at 883f447)."""
        self._forget_before(now - self._window_s)
        if not self._times:
            return 0.0
        return len(self._times) / max(now - self._times[0], MIN_SPAN_S)

    def _forget_before(self, cutoff: float) -> None:
        while self._times and self._times[0] < cutoff:
            self._times.popleft()
