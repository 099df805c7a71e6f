"""N-gram (prompt lookup) drafting: guess that the context continues as it did the last time its
final few tokens appeared.

Answers that quote or edit their prompt (code edits, extraction, summaries with quotations)
repeat long runs of it, and so do answers that loop. When the last `n` tokens of a request's
context occurred earlier in it, the tokens that followed them there are the draft. The longest
such suffix wins (MAX_NGRAM down to MIN_NGRAM tokens; longer ones are rarer and more telling),
and among its occurrences the latest, nearest in the text.

Each request's n-grams are indexed as its context grows (it only ever grows: prompt, then
output): a step costs a few dict operations per new token, not a scan of the whole context.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from pdserve.core.request import Request

MIN_NGRAM = 2  # a single token matches almost everywhere (" the"): its drafts mostly fail
MAX_NGRAM = 4

NGram = tuple[int, ...]


class NgramIndex:
    """Where each n-gram of a growing token sequence last ended (exclusive end index)."""

    def __init__(self) -> None:
        self._latest_end: dict[NGram, int] = {}
        self._num_indexed = 0  # n-grams ending before this index are in `_latest_end`

    def propose(self, token_ids: Sequence[int], max_drafts: int) -> list[int]:
        """The tokens that followed the latest earlier occurrence of the longest suffix."""
        self._index(token_ids)
        for n in range(min(MAX_NGRAM, len(token_ids)), MIN_NGRAM - 1, -1):
            end = self._latest_end.get(tuple(token_ids[-n:]))
            if end is not None:
                return list(token_ids[end : end + max_drafts])
        return []

    def _index(self, token_ids: Sequence[int]) -> None:
        """Indexes every n-gram that has a token after it. The suffix has none yet (nothing to
        draft from), so it is indexed once the context has grown past it."""
        for end in range(self._num_indexed, len(token_ids)):
            for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                self._latest_end[tuple(token_ids[end - n : end])] = end
        self._num_indexed = max(self._num_indexed, len(token_ids))


class NgramProposer:
    def __init__(self) -> None:
        # Weak keys: a request's index goes when the engine forgets the request, with no hook
        # in every path that finishes one (stop, abort, error, migration).
        self._indexes: weakref.WeakKeyDictionary[Request, NgramIndex] = weakref.WeakKeyDictionary()

    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int]) -> list[list[int]]:
        drafts = []
        for request, limit in zip(requests, max_drafts, strict=True):
            index = self._indexes.setdefault(request, NgramIndex())
            drafts.append(index.propose(request.all_token_ids, limit))
        return drafts
