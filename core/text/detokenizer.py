"""Incremental detokenization with stop strings.

Text is decoded from all output tokens each time (cheap at these lengths and always correct for
byte-level BPE), and a chunk is released only when it cannot be (a) the start of a multi-byte
character still being completed or (b) the start of a stop string: text past a stop is never
returned.
"""

from __future__ import annotations

from typing import Protocol

_INCOMPLETE = "\ufffd"


class Tokenizer(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._hold_back = max((len(text) for text in stop), default=1) - 1
        self._token_ids: list[int] = []
        self.text = ""  # all text released so far
        self.stopped = False

    def add(self, token_ids: list[int], final: bool) -> str:
        """Adds tokens; returns the newly released text. Sets `stopped` on a stop string."""
        self._token_ids.extend(token_ids)
        full = self._tokenizer.decode(self._token_ids, skip_special_tokens=True)
        stop_at = self._find_stop(full)
        if stop_at is not None:
            self.stopped = True
            return self._release(full[:stop_at])
        if final:
            return self._release(full)
        safe_end = len(full) - self._hold_back
        if full.endswith(_INCOMPLETE):
            safe_end = min(safe_end, len(full.rstrip(_INCOMPLETE)))
        return self._release(full[: max(safe_end, len(self.text))])

    def _find_stop(self, full: str) -> int | None:
        # Only the part not yet released can hold a new stop (released text was checked).
        start = max(len(self.text) - self._hold_back, 0)
        hits = [pos for text in self._stop if (pos := full.find(text, start)) >= 0]
        return min(hits) if hits else None

    def _release(self, upto: str) -> str:
        delta = upto[len(self.text) :]
        self.text = upto
        return delta
