"""The engine's per-token text cost as outputs grow: the streaming detokenizer against decoding the
whole output every token (the path tokenizers without a stream keep; core/text/detokenizer.py).

    pdserve bench detokenizer [--model PATH] [--lengths 100,1000,4000] [--json]

One request's output fed a token at a time, as the engine does, through `IncrementalDetokenizer`
with the model's own tokenizer; the whole-decode arm is the same class over the tokenizer with its
streaming backend hidden. Tokens are seeded random ids past the special ones (as the offline
workloads draw them). Per length: the mean microseconds a token over the whole output, and over
its last 100 tokens but the final one (what a running step pays at that length; the final token
decodes the whole output once).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from pdserve.bench.arg_types import positive_ints
from pdserve.bench.offline.make_workloads import FIRST_ID
from pdserve.core.model.source import resolve_model
from pdserve.core.text.detokenizer import IncrementalDetokenizer
from pdserve.core.text.tokenizer import load_tokenizer

TAIL = 100
SEED = 5


class WholeDecode:
    """A tokenizer seen without its streaming backend."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")
    parser.add_argument(
        "--lengths", type=positive_ints, default=[100, 1000, 4000], help="output lengths"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per row")


def run(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(resolve_model(args.model))
    draw = random.Random(SEED)
    for length in args.lengths:
        tokens = [draw.randrange(FIRST_ID, tokenizer.vocab_size) for _ in range(length)]
        for path, seen_as in (("stream", tokenizer), ("whole", WholeDecode(tokenizer))):
            row = {"path": path, "output_tokens": length, **_time_tokens(seen_as, tokens)}
            print(json.dumps(row) if args.json else _line(row))
    return 0


def _time_tokens(tokenizer: Any, tokens: list[int]) -> dict[str, float]:
    detokenizer = IncrementalDetokenizer(tokenizer, ())
    times = []
    for index, token in enumerate(tokens):
        start = time.perf_counter()
        detokenizer.add([token], final=index == len(tokens) - 1)
        times.append(time.perf_counter() - start)
    tail = times[-TAIL - 1 : -1]  # the last step's whole decode aside: not a running step's
    return {
        "us_per_token": round(1e6 * sum(times) / len(times), 2),
        "us_per_token_last_100": round(1e6 * sum(tail) / len(tail), 2),
    }


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['path']:<7} {row['output_tokens']:>6} tokens: {row['us_per_token']:>9.2f} us/token, "
        f"last {TAIL}: {row['us_per_token_last_100']:>9.2f} us/token"
    )
