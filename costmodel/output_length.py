"""How many more tokens a running stream will generate: learned from the streams that finished,
not read off `max_tokens`.

A client's `max_tokens` is a limit, not a forecast: chat clients ask for 1,024 or 4,096 and stop
at EOS after a few hundred. Priced as the tokens still to come, a large limit made a stream look
endless: adaptive placement charged its decode for the whole limit, and the `mean` step budget
let it lend the slack of thousands of gaps that never come (costmodel/step_budget.py).

Streams are grouped by their `max_tokens` rounded up to a power of two (a client's settings, so
mostly one kind of traffic per group). For a stream of a group that has generated k tokens, the
forecast is what the group's finished streams that went past k generated after k, on average
(the mean residual length: a stream already long is likely to run longer than a fresh one), capped
by what its limit leaves. Until MIN_FINISHED such streams are known, the limit is the forecast,
as before. Only streams that ended by themselves (EOS, a stop, the limit) count: an abort says
nothing of length.
"""

from __future__ import annotations

import bisect
import collections

WINDOW = 256  # finished streams kept per group (the most recent)
MIN_FINISHED = 8  # fewer past k: no forecast, the limit stands


class OutputLengths:
    """Forecasts by group from the last WINDOW finished streams of each."""

    def __init__(self, window: int = WINDOW, min_finished: int = MIN_FINISHED) -> None:
        self._window, self._min_finished = window, min_finished
        self._order: dict[int, collections.deque[int]] = {}  # group -> lengths, oldest first
        self._sorted: dict[int, list[int]] = {}  # group -> the same lengths, ascending

    def record(self, max_tokens: int, generated: int) -> None:
        """A stream that asked for up to `max_tokens` ended by itself after `generated`."""
        group = _group(max_tokens)
        order = self._order.setdefault(group, collections.deque())
        lengths = self._sorted.setdefault(group, [])
        if len(order) == self._window:
            lengths.pop(bisect.bisect_left(lengths, order.popleft()))
        order.append(generated)
        bisect.insort(lengths, generated)

    def remaining(self, max_tokens: int, generated: int = 0) -> int:
        """Tokens a stream that asked for up to `max_tokens` and has `generated` will still
        generate, by the forecast (never more than its limit leaves)."""
        left = max(max_tokens - generated, 0)
        lengths = self._sorted.get(_group(max_tokens), [])
        longer = lengths[bisect.bisect_right(lengths, generated) :]
        if len(longer) < self._min_finished:
            return left
        beyond = sum(longer) / len(longer) - generated
        return min(left, round(beyond))


def _group(max_tokens: int) -> int:
    return max(max_tokens - 1, 0).bit_length()  # 2^(g-1) < max_tokens <= 2^g
