"""`pdserve bench peers`: pdserve and llama.cpp on the same workload and weights, in one run.

For every `--slots N`: pdserve's continuous engine (max batch N) times the workload in this
process, then llama-server (`-t 2 -np N -cb`, context N x 512) serves it over HTTP `/completion`,
all requests at t=0, greedy, EOS ignored, exactly max_tokens each. `--batch1` adds the batch-1
decode time per token of both (pdserve: median engine step; llama.cpp: llama-batched-bench).

`--speculative ngram`: both engines draft from each request's own context. pdserve runs with
`speculative="ngram"` (`--num-speculative-tokens` drafts a step); llama-server runs once per
`--llama-spec-types` entry (`--spec-type T --spec-draft-n-max K`), and the ratios take its best.
Batch 1 is then timed the same way for both, since llama-batched-bench does not speculate: the
first `--batch1-requests` requests one after another, decode time from each one's first token to
its last over the tokens after the first (pdserve: its stream; llama.cpp: `timings.predicted_ms`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pdserve.bench.arg_types import positive_int, positive_ints
from pdserve.bench.offline import decode as offline_decode
from pdserve.bench.offline.engines import EngineKind, Precision, load_engine, time_run
from pdserve.bench.offline.spec import load_llm, time_generate
from pdserve.bench.offline.workload import (
    WORKLOAD_DIR,
    WorkloadRequest,
    total_output_tokens,
    workload_and_model,
)
from pdserve.bench.peers import llama as peers_llama
from pdserve.bench.peers.report import PeerResult, json_line, report
from pdserve.core.config import NGRAM, SPECULATIVE_METHODS, EngineConfig
from pdserve.core.kv.cache import DTYPES
from pdserve.core.model.precision import QUANTIZATIONS
from pdserve.local.ports import free_port

DEFAULT_CACHE = Path.home() / ".cache" / "pdserve" / "peers"
WARMUP_REQUESTS = 4
WARMUP_PROMPT_TOKENS = 8
WARMUP_MAX_TOKENS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", type=Path, default=WORKLOAD_DIR / "mixed.json")
    parser.add_argument(
        "--slots",
        type=positive_ints,
        required=True,
        metavar="N[,N...]",
        help="pdserve max batch and llama-server parallel slots; a comma list runs each",
    )
    parser.add_argument("--batch1", action="store_true", help="also time batch-1 decode")
    parser.add_argument("--json", action="store_true", help="one JSON object per result line")
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="llama.cpp build/GGUFs")
    parser.add_argument(
        "--gguf",
        type=peers_llama.GgufType,
        default=peers_llama.GgufType.F32,
        choices=list(peers_llama.GgufType),
        metavar="{" + ",".join(kind.value for kind in peers_llama.GgufType) + "}",
        help="llama.cpp's weights: f32 (the same numbers as pdserve's float32), q8_0, q4_1",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPES), help="pdserve's model/KV dtype"
    )
    parser.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    parser.add_argument("--decode-steps", type=int, default=128, help="tokens timed by --batch1")
    parser.add_argument(
        "--speculative",
        default="off",
        choices=SPECULATIVE_METHODS,
        help="both engines speculate with n-gram drafts (llama-server: each --llama-spec-types)",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=positive_int,
        default=EngineConfig().num_speculative_tokens,
        help="most drafts a request verifies per step, both engines",
    )
    parser.add_argument(
        "--llama-spec-types",
        type=_spec_types,
        default=list(peers_llama.NGRAM_SPEC_TYPES),
        metavar="T,...",
        help="llama-server's --spec-type values to run (default: every n-gram type)",
    )
    parser.add_argument(
        "--batch1-requests",
        type=positive_int,
        default=8,
        help="with --speculative: the requests --batch1 runs one at a time",
    )


def _spec_types(text: str) -> list[str]:
    types = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(types) - set(peers_llama.NGRAM_SPEC_TYPES))
    if not types or unknown:
        raise argparse.ArgumentTypeError(
            f"expected some of {','.join(peers_llama.NGRAM_SPEC_TYPES)}, got {text!r}"
        )
    return types


def run(args: argparse.Namespace) -> int:
    inputs = workload_and_model(args.workload, args.model)
    if inputs is None:
        return 2
    workload, model_dir = inputs
    peer = peers_llama.Peer(args.cache)
    peers_llama.ensure_built(peer)
    gguf = peers_llama.ensure_gguf(peer, model_dir, args.gguf)
    peer = peers_llama.runnable(peer, gguf)
    precision = Precision(args.dtype, args.quantization)
    weights = {"pdserve": precision.label, "llama.cpp": args.gguf.value}
    results: list[PeerResult] = []

    def done(*new: PeerResult) -> None:  # printed as they come: a killed run keeps its results
        results.extend(new)
        for result in new:
            line = json_line(result, args.workload.name) if args.json else str(result)
            print(line, file=sys.stdout if args.json else sys.stderr, flush=True)

    speculations = _llama_speculations(args)
    if args.batch1 and args.speculative == NGRAM:
        batch1_workload = workload[: args.batch1_requests]
        done(_batch1_speculative_pdserve(args, model_dir, batch1_workload, weights["pdserve"]))
        for speculation in speculations:
            done(*_llama_if_it_runs(peer, gguf, batch1_workload, 1, weights, speculation, True))
    elif args.batch1:
        done(*_batch1(args, peer, gguf, model_dir, list(workload[0].prompt), weights))
    for slots in args.slots:
        done(_run_pdserve(args, model_dir, workload, slots, weights["pdserve"]))
        for speculation in speculations:
            done(*_llama_if_it_runs(peer, gguf, workload, slots, weights, speculation))
    print(report(results), file=sys.stderr if args.json else sys.stdout)
    return 0


def _llama_speculations(args: argparse.Namespace) -> list[peers_llama.LlamaSpeculation | None]:
    if args.speculative != NGRAM:
        return [None]
    return [
        peers_llama.LlamaSpeculation(spec_type, args.num_speculative_tokens)
        for spec_type in args.llama_spec_types
    ]


def _run_pdserve(
    args: argparse.Namespace,
    model_dir: Path,
    workload: list[WorkloadRequest],
    slots: int,
    weights: str,
) -> PeerResult:
    precision = Precision(args.dtype, args.quantization)
    if args.speculative == NGRAM:
        llm = load_llm(model_dir, workload, slots, NGRAM, args.num_speculative_tokens, precision)
        load = os.getloadavg()[0]
        timed = time_generate(llm, workload, ignore_eos=True, batch1=False)
        tokens = sum(len(output) for output in timed.outputs)
        acceptance = timed.accepted / max(timed.drafted, 1)
        return PeerResult(
            "pdserve", slots, tokens, timed.seconds, load, weights, None, NGRAM, acceptance
        )
    engine = load_engine(EngineKind.CONTINUOUS, model_dir, workload, slots, precision)
    load = os.getloadavg()[0]
    run = time_run(engine, workload, 0)
    return PeerResult("pdserve", slots, run.output_tokens, run.seconds, load, weights)


def _warmup(workload: list[WorkloadRequest]) -> list[WorkloadRequest]:
    """Short requests cut from the first prompt, none of them a timed request: speculation
    types that remember n-grams across requests (ngram-mod, ngram-cache) learn nothing from
    the warm-up that the timed run will ask for."""
    prompt = workload[0].prompt[:WARMUP_PROMPT_TOKENS]
    return [WorkloadRequest(prompt, WARMUP_MAX_TOKENS)] * WARMUP_REQUESTS


def _batch1_speculative_pdserve(
    args: argparse.Namespace, model_dir: Path, workload: list[WorkloadRequest], weights: str
) -> PeerResult:
    precision = Precision(args.dtype, args.quantization)
    llm = load_llm(model_dir, workload, 1, NGRAM, args.num_speculative_tokens, precision)
    load = os.getloadavg()[0]
    timed = time_generate(llm, workload, ignore_eos=True, batch1=True)
    assert timed.batch1_seconds is not None
    ms_per_token = 1e3 * timed.batch1_seconds / max(timed.batch1_tokens, 1)
    tokens = sum(len(output) for output in timed.outputs)
    acceptance = timed.accepted / max(timed.drafted, 1)
    return PeerResult(
        "pdserve", 1, tokens, timed.seconds, load, weights, ms_per_token, NGRAM, acceptance
    )


def _llama_if_it_runs(
    peer: peers_llama.Peer,
    gguf: Path,
    workload: list[WorkloadRequest],
    slots: int,
    weights: dict[str, str],
    speculation: peers_llama.LlamaSpeculation | None,
    one_at_a_time: bool = False,
) -> list[PeerResult]:
    """llama-server's run, or none when a speculation type does not run on this build (said on
    stderr): one type's failure must not cost the others' results. Plain runs must work."""
    try:
        return [
            _run_llama(
                peer, gguf, workload, slots, weights["llama.cpp"], speculation, one_at_a_time
            )
        ]
    except (RuntimeError, OSError) as error:  # TimeoutError and URLError are OSErrors
        if speculation is None:
            raise
        print(f"peers: --spec-type {speculation.spec_type} skipped: {error}", file=sys.stderr)
        return []


def _run_llama(
    peer: peers_llama.Peer,
    gguf: Path,
    workload: list[WorkloadRequest],
    slots: int,
    weights: str,
    speculation: peers_llama.LlamaSpeculation | None,
    one_at_a_time: bool = False,
) -> PeerResult:
    """All requests at once on `slots` slots, or (`one_at_a_time`) each alone: batch 1."""
    with peers_llama.serving(peer, gguf, slots, free_port(), speculation) as url:
        peers_llama.run_workload(url, _warmup(workload))
        load = os.getloadavg()[0]
        if one_at_a_time:
            run = peers_llama.run_one_at_a_time(url, workload)
        else:
            run = peers_llama.run_workload(url, workload)
    return PeerResult(
        "llama.cpp",
        slots,
        total_output_tokens(workload),
        run.seconds,
        load,
        weights,
        run.ms_per_token if one_at_a_time else None,
        speculation.spec_type if speculation is not None else "off",
        run.acceptance_rate,
        peer.flags,
    )


def _batch1(
    args: argparse.Namespace,
    peer: peers_llama.Peer,
    gguf: Path,
    model_dir: Path,
    prompt: list[int],
    weights: dict[str, str],
) -> list[PeerResult]:
    steps = args.decode_steps
    load = os.getloadavg()[0]
    ours = offline_decode.measure_batch1_decode(
        model_dir, prompt, steps, Precision(args.dtype, args.quantization)
    )
    theirs_load = os.getloadavg()[0]
    theirs_ms = peers_llama.batch1_ms_per_token(peer, gguf, len(prompt), steps)
    ours_ms = 1e3 * ours.median_step
    return [
        PeerResult("pdserve", 1, steps, steps * ours_ms / 1e3, load, weights["pdserve"], ours_ms),
        PeerResult(
            "llama.cpp",
            1,
            steps,
            steps * theirs_ms / 1e3,
            theirs_load,
            weights["llama.cpp"],
            theirs_ms,
            flags=peer.flags,
        ),
    ]
