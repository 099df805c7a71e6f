"""`pdserve bench grammar-libraries`: the grammar engines a structured-output backend could use,
on this CPU and the model's tokenizer: how long each takes to read the tokenizer, to compile the
workload's schemas, and to compute the next token's mask along a valid answer (the per-step cost
on the engine thread; applying the mask to the logits is the same torch work whichever library
filled it).

    pdserve bench grammar-libraries --json
    uv pip install xgrammar==0.2.8 outlines-core==0.2.14   # to compare those too

llguidance ships with pdserve (core/structured/grammar.py); xgrammar and outlines-core are
measured when installed and reported as missing otherwise. Each schema's answer is the first
valid record the model gives under pdserve's own constraint, so every library walks the same
tokens.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pdserve.bench.offline.structured_workload import SCHEMA_DIR
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.structured.grammar import COMPILE_THREADS
from pdserve.core.structured.params import StructuredOutputsParams
from pdserve.core.text.chat import ChatMessage, chat_prompt

LIBRARIES = ("xgrammar", "llguidance", "outlines_core")


@dataclass(frozen=True)
class Walk:
    """One schema and a valid answer's tokens."""

    name: str
    schema: str
    token_ids: list[int]


@dataclass(frozen=True)
class LibraryRow:
    library: str
    installed: bool
    tokenizer_seconds: float | None = None
    compile_ms_median: float | None = None  # per schema, cold
    mask_us_mean: float | None = None  # per token along the answers
    mask_us_median: float | None = None
    mask_us_p90: float | None = None
    masks: int = 0


Masker = Callable[[str, list[int]], tuple[float, list[float]]]  # schema -> (compile s, mask s)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")
    parser.add_argument("--json", action="store_true", help="one JSON object per library")


def run(args: argparse.Namespace) -> int:
    llm = LLM(args.model, num_kv_blocks=64)
    tokenizer = llm.engine.tokenizer
    config = llm.engine.model_config
    walks = _walks(llm)
    for library in LIBRARIES:
        row = _measure(library, tokenizer, config.vocab_size, config.eos_token_ids[0], walks)
        if args.json:
            print(json.dumps(asdict(row)), flush=True)
        print(_line(row), file=sys.stderr if args.json else sys.stdout, flush=True)
    return 0


def _walks(llm: LLM) -> list[Walk]:
    walks = []
    for path in sorted(SCHEMA_DIR.glob("*.json")):
        schema = path.read_text()
        question = f"Describe an example {path.stem} as a JSON object."
        prompt = chat_prompt(llm.engine.tokenizer, [ChatMessage("user", question)])
        params = SamplingParams(
            max_tokens=256, temperature=0, structured_outputs=StructuredOutputsParams(json=schema)
        )
        (output,) = llm.generate(prompt, params)
        walks.append(Walk(path.stem, schema, list(output.outputs[0].token_ids)))
    return walks


def _measure(
    library: str, tokenizer: Any, vocab_size: int, eos: int, walks: list[Walk]
) -> LibraryRow:
    if importlib.util.find_spec(library) is None:
        return LibraryRow(library, installed=False)
    started = time.perf_counter()
    masker = _MAKERS[library](tokenizer, vocab_size, eos)
    tokenizer_seconds = time.perf_counter() - started
    compiles: list[float] = []
    masks: list[float] = []
    for walk in walks:
        compile_seconds, mask_seconds = masker(walk.schema, walk.token_ids)
        compiles.append(compile_seconds)
        masks.extend(mask_seconds)
    return LibraryRow(
        library,
        installed=True,
        tokenizer_seconds=round(tokenizer_seconds, 3),
        compile_ms_median=round(1000 * statistics.median(compiles), 2),
        mask_us_mean=round(1e6 * statistics.fmean(masks), 1),
        mask_us_median=round(1e6 * statistics.median(masks), 1),
        mask_us_p90=round(1e6 * statistics.quantiles(masks, n=10)[-1], 1),
        masks=len(masks),
    )


def _xgrammar(tokenizer: Any, vocab_size: int, eos: int) -> Masker:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=[eos]
    )
    # As a worker compiles (core/structured/grammar.py), its cache off: every schema cold.
    compiler = xgrammar.GrammarCompiler(info, max_threads=COMPILE_THREADS, cache_enabled=False)

    def walk(schema: str, token_ids: list[int]) -> tuple[float, list[float]]:
        started = time.perf_counter()
        matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(schema))
        compiled = time.perf_counter() - started
        bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        times = []
        for token in token_ids[:-1]:  # the last is EOS: nothing to mask after it
            started = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times.append(time.perf_counter() - started)
            assert matcher.accept_token(token)
        return compiled, times

    return walk


def _llguidance(tokenizer: Any, vocab_size: int, eos: int) -> Masker:
    import llguidance
    import llguidance.hf
    import llguidance.numpy  # the mask pdserve fills (core/structured/grammar.py)

    llg_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    def walk(schema: str, token_ids: list[int]) -> tuple[float, list[float]]:
        started = time.perf_counter()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        matcher = llguidance.LLMatcher(llg_tokenizer, grammar)
        compiled = time.perf_counter() - started
        bitmask = llguidance.numpy.allocate_token_bitmask(1, vocab_size)
        times = []
        for token in token_ids[:-1]:
            started = time.perf_counter()
            llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, 0)
            times.append(time.perf_counter() - started)
            assert matcher.consume_token(token), matcher.get_error()
        return compiled, times

    return walk


def _outlines_core(tokenizer: Any, vocab_size: int, eos: int) -> Masker:
    from outlines_core import (  # type: ignore[import-not-found, unused-ignore]
        Guide,
        Index,
        Vocabulary,
    )
    from outlines_core.json_schema import (  # type: ignore[import-not-found, unused-ignore]
        build_regex_from_schema,
    )

    by_text: dict[str, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id != eos:
            by_text.setdefault(tokenizer.convert_tokens_to_string([token]), []).append(token_id)
    vocabulary = Vocabulary(eos, by_text)

    def walk(schema: str, token_ids: list[int]) -> tuple[float, list[float]]:
        started = time.perf_counter()
        # The whitespace xgrammar and llguidance allow between JSON tokens (outlines' default
        # allows no newline), so that the walk is a valid answer for all three.
        regex = build_regex_from_schema(schema, whitespace_pattern=r"[\n\t ]*")
        guide = Guide(Index(regex, vocabulary))
        compiled = time.perf_counter() - started
        times = []
        for token in token_ids[:-1]:
            started = time.perf_counter()
            guide.get_tokens()  # the allowed ids: outlines-core's form of the mask
            times.append(time.perf_counter() - started)
            guide.advance(token)
        return compiled, times

    return walk


_MAKERS: dict[str, Callable[[Any, int, int], Masker]] = {
    "xgrammar": _xgrammar,
    "llguidance": _llguidance,
    "outlines_core": _outlines_core,
}


def _line(row: LibraryRow) -> str:
    if not row.installed:
        return f"{row.library:>13}: not installed"
    return (
        f"{row.library:>13}: tokenizer {row.tokenizer_seconds:.2f} s, compile "
        f"{row.compile_ms_median:.1f} ms/schema, mask {row.mask_us_mean:.1f} us mean, "
        f"{row.mask_us_median:.1f} us median "
        f"({row.mask_us_p90:.1f} p90) over {row.masks} tokens"
    )
