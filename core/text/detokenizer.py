"""Incremental detokenization with stop strings.

Each step's tokens extend the request's text through the tokenizer library's own streaming
decoder (`tokenizers.decoders.DecodeStream`, as vLLM's fast detokenizer uses it): it decodes a
few tokens of context with each new one, so a token costs the same at position 4,000 as at 10.
Decoding every output token again each step, as this module once did, cost 16 us a token at
100 tokens of output, 112 us at 1,000 and 571 us at 4,000 (averages over the output, SmolLM2's
tokenizer, one core), a share of the engine's step that grew with every stream's length.
Tokenizers without that decoder (slow, Python-only ones, or ones that clean up spaces after
decoding, which a stream cannot undo) keep the whole-output decode.

A chunk is released only when it cannot be (a) the start of a multi-byte character still being
completed or (b) the start of a stop string: text past a stop is never returned.
"""

from __future__ import annotations

from typing import Any, Protocol

from tokenizers.decoders import DecodeStream

_INCOMPLETE = "\ufffd"


class Tokenizer(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._hold_back = max((len(text) for text in stop), default=1) - 1
        self._backend = _streaming_backend(tokenizer)
        self._stream = DecodeStream(skip_special_tokens=True) if self._backend else None
        self._token_ids: list[int] = []
        self._decoded = ""  # the stream's text so far
        self.text = ""  # all text released so far
        self.stopped = False

    def add(self, token_ids: list[int], final: bool) -> str:
        """Adds tokens; returns the newly released text. Sets `stopped` on a stop string."""
        self._token_ids.extend(token_ids)
        full = self._whole() if final else self._decode(token_ids)
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

    def _decode(self, token_ids: list[int]) -> str:
        """The text of every token so far (a stream holds back an unfinished character)."""
        if self._stream is None:
            return self._whole()
        pieces = [self._stream.step(self._backend, token) for token in token_ids]
        self._decoded += "".join(piece for piece in pieces if piece)
        return self._decoded

    def _whole(self) -> str:
        """Every token decoded at once: the last step's text, where an output cut in the middle
        of a character ends with the replacement character, as the tokenizer's decode has it."""
        return self._tokenizer.decode(self._token_ids, skip_special_tokens=True)

    def _find_stop(self, full: str) -> int | None:
        # Only the part not yet released can hold a new stop (released text was checked).
        start = max(len(self.text) - self._hold_back, 0)
        hits = [pos for text in self._stop if (pos := full.find(text, start)) >= 0]
        return min(hits) if hits else None

    def _release(self, upto: str) -> str:
        delta = upto[len(self.text) :]
        self.text = upto
        return delta


def _streaming_backend(tokenizer: Tokenizer) -> Any:
    """The `tokenizers.Tokenizer` under a fast tokenizer whose decode a stream reproduces
    exactly; None otherwise."""
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    return getattr(tokenizer, "backend_tokenizer", None)
