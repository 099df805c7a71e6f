"""The streaming detokenizer releases the text (and stops) that decoding the whole output each
step released (the path tokenizers without a stream keep), on the default model's tokenizer:
multi-byte characters split across tokens, invalid byte runs, special tokens, stop strings,
several tokens a step; it lands at the same place however the tokens came; and it decodes the
whole output once, at the end, not once a token."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from pdserve.core.text.detokenizer import IncrementalDetokenizer
from pdserve.core.text.tokenizer import load_tokenizer

CASES = 200
TOKENS = 48


class WholeDecodeOnly:
    """The tokenizer without its streaming backend, counting its whole-output decodes."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.decodes = 0

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        self.decodes += 1
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))


class CountingDecodes(WholeDecodeOnly):
    """The tokenizer as it is, its streaming backend included."""

    @property
    def backend_tokenizer(self) -> Any:
        return self._tokenizer.backend_tokenizer


@pytest.fixture(scope="module")
def engine_tokenizer(model_dir: Path) -> Any:
    return load_tokenizer(model_dir)


def _token_pool(tokenizer: Any) -> list[int]:
    """Tokens of text with accents, CJK and emoji (split across byte tokens), plain words, and
    the special tokens (skipped in the text)."""
    text = "Grüße, naïve café: 日本語のテキスト 🙂🚀 and plain words, numbers 12345.\n"
    return [*tokenizer.encode(text), *tokenizer.all_special_ids]


def _release_all(
    detokenizer: IncrementalDetokenizer, tokens: list[int], chunks: list[int]
) -> list[str]:
    released, start = [], 0
    for size in chunks:
        end = min(start + size, len(tokens))
        released.append(detokenizer.add(tokens[start:end], final=end == len(tokens)))
        start = end
        if detokenizer.stopped or end == len(tokens):
            break
    return released


@pytest.mark.parametrize("stop", [(), ("ç", " words,", "🙂")])
def test_streaming_releases_the_whole_decode_in_order(
    engine_tokenizer: Any, stop: tuple[str, ...]
) -> None:
    """Every release extends what came before, and together they are the text (and the stop)
    that decoding the whole output gives. Where bytes do not yet form a character the stream
    may release a little later than the whole decode did (the space before a split character
    waits for it), never other text."""
    pool = _token_pool(engine_tokenizer)
    draw = random.Random(7)
    for _ in range(CASES):
        tokens = [draw.choice(pool) for _ in range(TOKENS)]
        chunks = [draw.choice((1, 1, 1, 2, 3)) for _ in range(TOKENS)]
        streaming = IncrementalDetokenizer(engine_tokenizer, stop)
        whole = IncrementalDetokenizer(WholeDecodeOnly(engine_tokenizer), stop)
        released = _release_all(streaming, tokens, chunks)
        _release_all(whole, tokens, chunks)
        assert (streaming.text, streaming.stopped) == (whole.text, whole.stopped)
        assert "".join(released) == streaming.text
        if not stop:
            assert streaming.text == engine_tokenizer.decode(tokens, skip_special_tokens=True)


def test_what_is_released_depends_on_the_tokens_not_on_how_they_came(
    engine_tokenizer: Any,
) -> None:
    """A migrated stream's new worker adds the whole output so far at once; the old one added it
    a step at a time. The client has the old one's text: the new one must be at the same place."""
    pool = _token_pool(engine_tokenizer)
    draw = random.Random(11)
    for _ in range(CASES):
        tokens = [draw.choice(pool) for _ in range(TOKENS)]
        stepwise = IncrementalDetokenizer(engine_tokenizer, (" words,",))
        for token in tokens:
            stepwise.add([token], final=False)
        at_once = IncrementalDetokenizer(engine_tokenizer, (" words,",))
        at_once.add(tokens, final=False)
        assert (at_once.text, at_once.stopped) == (stepwise.text, stepwise.stopped)


def test_an_output_cut_inside_a_character_ends_as_the_tokenizer_decodes_it(
    engine_tokenizer: Any,
) -> None:
    emoji = engine_tokenizer.encode("🙂")
    assert len(emoji) > 1  # split across byte tokens
    tokens = [*engine_tokenizer.encode("ok "), *emoji[:-1]]
    detokenizer = IncrementalDetokenizer(engine_tokenizer, ())
    released = [detokenizer.add([token], final=False) for token in tokens[:-1]]
    released.append(detokenizer.add(tokens[-1:], final=True))
    assert "".join(released) == engine_tokenizer.decode(tokens, skip_special_tokens=True)
    assert released[-1].endswith("\ufffd")


def test_the_whole_output_is_decoded_once_not_once_a_token(engine_tokenizer: Any) -> None:
    tokens = engine_tokenizer.encode("a few words of output, long enough to count " * 8)
    streamed, whole = CountingDecodes(engine_tokenizer), WholeDecodeOnly(engine_tokenizer)
    for counted in (streamed, whole):
        detokenizer = IncrementalDetokenizer(counted, ())
        for index, token in enumerate(tokens):
            detokenizer.add([token], final=index == len(tokens) - 1)
    assert streamed.decodes == 1  # the last step's
    assert whole.decodes == len(tokens)
