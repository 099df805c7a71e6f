"""`pdserve bench spec`: speculative decoding (n-gram drafts) against none: same engine, same
workload, same run.

    pdserve bench spec --workload bench/workloads/repetition.json --slots 1,16 --batch1 --json
    pdserve bench spec --workload bench/offline/workloads/mixed.json --slots 16 --batch1

For each `--slots N` (max_num_seqs) both modes are loaded and warmed up, then timed in turn: the
whole workload arrives at once and runs greedy to its end (EOS, or max_tokens; `--ignore-eos`
runs every request to max_tokens), tokens/s = output tokens / wall time of the generate,
prefill included. With `--batch1` each mode also runs the requests one at a time and
`ms_per_token_batch1` is decode's time per token: from each request's first token to its last,
summed over the requests, over the tokens after the first (prefill left out).

Greedy output is the target model's in both modes, so both produce the same tokens and their
speeds compare directly; every row says whether the tokens matched (`outputs_match`).
With --json, one object per row on stdout:
`{"mode": "off" | "ngram", "slots": N, "tokens_per_s": ..., "ms_per_token_batch1": ...,
"acceptance_rate": ...}`, the drafts verified and kept (`drafted_tokens`, `accepted_tokens`:
drafts per output token say how often the n-grams found a match), and the run's conditions
(`ms_per_token_batch1` is null in the rows of whole-workload runs, `tokens_per_s` of a batch-1
row counts its prefills too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import torch

from pdserve.bench.arg_types import positive_int, positive_ints
from pdserve.bench.offline.engines import BLOCK_SIZE, FLOAT32, Precision, kv_blocks_needed
from pdserve.bench.offline.workload import WorkloadRequest, workload_and_model
from pdserve.core.config import NGRAM, EngineConfig
from pdserve.core.llm import LLM
from pdserve.core.sampling_params import SamplingParams

MODES = ("off", NGRAM)
WARMUP_PROMPT_TOKENS = 8
WARMUP_MAX_TOKENS = 4

Outputs = list[tuple[int, ...]]


@dataclass(frozen=True)
class Row:
    mode: str
    slots: int
    tokens_per_s: float
    ms_per_token_batch1: float | None
    acceptance_rate: float | None  # None with speculation off
    drafted_tokens: int  # drafts verified (per output token: how often drafting found a match)
    accepted_tokens: int
    output_tokens: int
    seconds: float
    outputs_match: bool  # the same tokens as the other mode's run of this setting


@dataclass(frozen=True)
class Timed:
    outputs: Outputs
    seconds: float
    batch1_seconds: float | None  # decode time summed over requests run one at a time
    batch1_tokens: int  # the tokens that time covers (each request's after its first)
    drafted: int
    accepted: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        type=Path,
        required=True,
        help="JSON list of {prompt: [token ids], max_tokens: N} (e.g. bench/workloads/"
        "repetition.json, bench/offline/workloads/mixed.json)",
    )
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")
    parser.add_argument(
        "--slots",
        type=positive_ints,
        default=[16],
        metavar="N,...",
        help="max_num_seqs (default: 16)",
    )
    parser.add_argument(
        "--batch1", action="store_true", help="also run requests one at a time: ms per token"
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=positive_int,
        default=EngineConfig().num_speculative_tokens,
        help="drafts verified per request and step",
    )
    parser.add_argument("--requests", type=positive_int, help="only the first N requests")
    parser.add_argument("--ignore-eos", action="store_true", help="every request to max_tokens")
    parser.add_argument("--json", action="store_true", help="one JSON object per row on stdout")


def run(args: argparse.Namespace) -> int:
    inputs = workload_and_model(args.workload, args.model)
    if inputs is None:
        return 2
    workload, model_dir = inputs
    workload = workload[: args.requests]
    log = sys.stderr if args.json else sys.stdout
    conditions = {
        "workload": args.workload.name,
        "requests": len(workload),
        "num_speculative_tokens": args.num_speculative_tokens,
        "ignore_eos": args.ignore_eos,
        "threads": torch.get_num_threads(),
        "loadavg_1m_before": round(os.getloadavg()[0], 2),
    }
    for slots in args.slots:
        llms = {
            mode: load_llm(model_dir, workload, slots, mode, args.num_speculative_tokens)
            for mode in MODES
        }
        timed = {
            mode: time_generate(llm, workload, args.ignore_eos, batch1=False)
            for mode, llm in llms.items()
        }
        _report(slots, timed, conditions, args.json, log)
        if args.batch1:
            timed = {
                mode: time_generate(llm, workload, args.ignore_eos, batch1=True)
                for mode, llm in llms.items()
            }
            _report(1, timed, conditions, args.json, log)
        del llms
    return 0


def load_llm(
    model_dir: Path,
    workload: list[WorkloadRequest],
    slots: int,
    mode: str,
    num_speculative_tokens: int,
    precision: Precision = FLOAT32,
) -> LLM:
    """Room for the `slots` largest requests at once (drafts included): nothing is preempted."""
    llm = LLM(
        model_dir,
        max_num_seqs=slots,
        block_size=BLOCK_SIZE,
        num_kv_blocks=kv_blocks_needed(workload, slots) + slots,
        num_swap_blocks=0,
        speculative=mode,
        num_speculative_tokens=num_speculative_tokens,
        dtype=precision.dtype,
        quantization=precision.quantization,
    )
    warmup = list(workload[0].prompt[:WARMUP_PROMPT_TOKENS])
    llm.generate([warmup] * 2, SamplingParams(max_tokens=WARMUP_MAX_TOKENS, temperature=0))
    return llm


def time_generate(
    llm: LLM, workload: list[WorkloadRequest], ignore_eos: bool, batch1: bool
) -> Timed:
    params = [
        SamplingParams(max_tokens=r.max_tokens, temperature=0, ignore_eos=ignore_eos)
        for r in workload
    ]
    before = llm.engine.stats()
    start = time.perf_counter()
    if batch1:
        outputs, batch1_seconds, batch1_tokens = _one_at_a_time(llm, workload, params)
    else:
        generated = llm.generate([list(r.prompt) for r in workload], params)
        outputs = [out.outputs[0].token_ids for out in generated]
        batch1_seconds, batch1_tokens = None, 0
    seconds = time.perf_counter() - start
    after = llm.engine.stats()
    return Timed(
        outputs,
        seconds,
        batch1_seconds,
        batch1_tokens,
        after.num_drafted_tokens - before.num_drafted_tokens,
        after.num_accepted_tokens - before.num_accepted_tokens,
    )


def _one_at_a_time(
    llm: LLM, workload: list[WorkloadRequest], params: list[SamplingParams]
) -> tuple[Outputs, float, int]:
    """Each request alone; decode seconds (first token to last) and the tokens after the first."""
    outputs: Outputs = []
    seconds = 0.0
    tokens_after_first = 0
    for request, sampling in zip(workload, params, strict=True):
        llm.engine.add_request(list(request.prompt), sampling)
        tokens: list[int] = []
        first_at = last_at = 0.0
        for delta in llm.stream():
            last_at = time.perf_counter()
            if not tokens:
                first_at = last_at
            tokens.extend(delta.new_token_ids)
        outputs.append(tuple(tokens))
        seconds += last_at - first_at
        tokens_after_first += len(tokens) - 1
    return outputs, seconds, tokens_after_first


def _report(
    slots: int, timed: dict[str, Timed], conditions: dict[str, object], as_json: bool, log: TextIO
) -> None:
    match = timed["off"].outputs == timed[NGRAM].outputs
    if not match:
        print("warning: the modes' greedy tokens differ", file=sys.stderr)
    for mode, timing in timed.items():
        tokens = sum(len(output) for output in timing.outputs)
        row = Row(
            mode=mode,
            slots=slots,
            tokens_per_s=tokens / timing.seconds,
            ms_per_token_batch1=(
                1000 * timing.batch1_seconds / max(timing.batch1_tokens, 1)
                if timing.batch1_seconds is not None
                else None
            ),
            acceptance_rate=timing.accepted / max(timing.drafted, 1) if mode != "off" else None,
            drafted_tokens=timing.drafted,
            accepted_tokens=timing.accepted,
            output_tokens=tokens,
            seconds=timing.seconds,
            outputs_match=match,
        )
        if as_json:
            print(json.dumps(asdict(row) | conditions), flush=True)
        print(_line(row), file=log, flush=True)


def _line(row: Row) -> str:
    batch1 = f", {row.ms_per_token_batch1:.1f} ms/token decode" if row.ms_per_token_batch1 else ""
    accepted = (
        f", {100 * row.acceptance_rate:.0f} % drafts kept"
        if row.acceptance_rate is not None
        else ""
    )
    return (
        f"{row.mode:>5} slots={row.slots:<3} {row.tokens_per_s:8.1f} tokens/s "
        f"({row.output_tokens} tokens in {row.seconds:.2f} s){batch1}{accepted}"
    )
