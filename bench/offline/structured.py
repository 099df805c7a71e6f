"""`pdserve bench structured`: the same requests free and under a JSON schema each, on the same
engine, in the same run.

    pdserve bench structured --slots 16 --repeats 3 --batch1 --json
    pdserve bench structured --router 127.0.0.1:50051 --repeats 3 --batch1 --json  # `pdserve up`

The workload (default bench/workloads/structured.json, `pdserve bench make-structured-workload`)
names a schema of bench/workloads/schemas/ per request. One engine per `--slots N`
(max_num_seqs) is loaded and warmed up, every schema compiled once (the compile time is reported
apart: a serving worker compiles a schema once and caches it); then each repeat runs the whole
workload at once, greedy, in both modes in turn ("json_schema": each request under its schema;
"off": no constraint, each request held to exactly the length its constrained answer had, EOS
ignored). So both modes run the same number of tokens per request in the same batches, and what
differs is the constraint's cost alone (a free answer is prose of another length: compared as
is, tokens/s would measure the batch's occupancy, not the masks). tokens/s = output tokens / wall
time, prefill included; `--batch1` also runs each request alone and reports decode's ms per token
(first token to last, prefill left out).

Every constrained output is checked: `valid` parsed and validated against its schema,
`truncated` ran into max_tokens (cannot parse), `invalid` ended by itself yet fails its schema
(must be 0). `mask_ms_per_step`: the engine thread's time filling and applying masks, per step.
With `--router` the passes go through a running cluster instead (bench/offline/
structured_router.py; `slots` is then 0: the cluster's own, and steps and mask times are on the
workers' /metrics).
With --json, one object per mode, setting and repeat on stdout, then one summary object per
setting: the ratio json_schema / off of tokens/s for each repeat and their min, median and max.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import torch

from pdserve.bench.arg_types import positive_int, positive_ints
from pdserve.bench.offline import structured_router
from pdserve.bench.offline.engines import BLOCK_SIZE, kv_blocks_needed
from pdserve.bench.offline.structured_report import Row, report, summary
from pdserve.bench.offline.structured_workload import SCHEMA_DIR, WORKLOAD_DIR
from pdserve.bench.offline.workload import WorkloadError, WorkloadRequest, load_workload
from pdserve.core.llm import LLM
from pdserve.core.model.source import resolve_model
from pdserve.core.outputs import FinishReason
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.structured.params import StructuredOutputsParams

MODES = ("off", "json_schema")


@dataclass(frozen=True)
class Output:
    token_ids: tuple[int, ...]
    text: str
    finish: FinishReason


@dataclass(frozen=True)
class Timed:
    outputs: list[Output]
    seconds: float
    steps: int | None  # None through a router: its workers step
    mask_seconds: float | None
    batch1_seconds: float | None = None  # decode time summed over requests run one at a time
    batch1_tokens: int = 0  # the tokens that time covers (each request's after its first)


@dataclass(frozen=True)
class StructuredRequest:
    request: WorkloadRequest
    schema_name: str
    schema: dict[str, Any]

    def constrained(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.request.max_tokens,
            temperature=0,
            structured_outputs=StructuredOutputsParams(json=self.schema),
        )

    def params(self, mode: str, length: int) -> SamplingParams:
        """Free, the request runs exactly `length` tokens (its constrained answer's)."""
        if mode == "json_schema":
            return self.constrained()
        return SamplingParams(max_tokens=length, temperature=0, ignore_eos=True)


# One pass of the whole workload: (each request's params, one at a time?) -> its timing.
Pass = Callable[[list[SamplingParams], bool], Timed]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        type=Path,
        default=WORKLOAD_DIR / "structured.json",
        help="JSON list of {prompt, max_tokens, schema: name in --schemas} (default: shipped)",
    )
    parser.add_argument("--schemas", type=Path, default=SCHEMA_DIR, help="folder of NAME.json")
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")
    parser.add_argument(
        "--slots", type=positive_ints, default=[16], metavar="N,...", help="max_num_seqs"
    )
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed passes per mode")
    parser.add_argument(
        "--batch1", action="store_true", help="also run requests one at a time: ms per token"
    )
    parser.add_argument("--requests", type=positive_int, help="only the first N requests")
    parser.add_argument(
        "--router", metavar="HOST:PORT", help="through a running cluster (`pdserve up`) instead"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per row on stdout")


def run(args: argparse.Namespace) -> int:
    try:
        workload = load_structured(args.workload, args.schemas)[: args.requests]
        model_dir = None if args.router else resolve_model(args.model)
    except (WorkloadError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    conditions = {
        "workload": args.workload.name,
        "requests": len(workload),
        "router": args.router,
        "threads": torch.get_num_threads(),
        "loadavg_1m_before": round(os.getloadavg()[0], 2),
    }
    if model_dir is None:
        router_pass = functools.partial(_router_pass, args.router, workload)
        _measure(router_pass, workload, 0, conditions, args)
        return 0
    for slots in args.slots:
        llm, compile_seconds = load_llm(model_dir, workload, slots)
        setting = {**conditions, "compile_seconds_once": round(compile_seconds, 3)}
        _measure(functools.partial(_engine_pass, llm, workload), workload, slots, setting, args)
        del llm
    return 0


def _measure(
    run_pass: Pass,
    workload: list[StructuredRequest],
    slots: int,
    setting: dict[str, object],
    args: argparse.Namespace,
) -> None:
    """The repeats of one setting, their summary, and the batch-1 rows."""
    log = sys.stderr if args.json else sys.stdout
    # Greedy: the constrained answers' lengths are the same in every pass; this one also warms
    # the engine and every grammar up.
    constrained = [item.constrained() for item in workload]
    lengths = [len(output.token_ids) for output in run_pass(constrained, False).outputs]
    ratios = []
    for repeat in range(args.repeats):
        rows = {
            mode: _row(run_pass, workload, lengths, mode, slots, repeat, False) for mode in MODES
        }
        ratios.append(rows["json_schema"].tokens_per_s / rows["off"].tokens_per_s)
        report(rows.values(), setting, args.json, log)
    summary(slots, ratios, setting, args.json, log)
    if args.batch1:
        batch1 = {mode: _row(run_pass, workload, lengths, mode, 1, 0, True) for mode in MODES}
        report(batch1.values(), setting, args.json, log)


def load_structured(workload_path: Path, schema_dir: Path) -> list[StructuredRequest]:
    """The workload's requests with their schemas (WorkloadError naming what is missing)."""
    requests = load_workload(workload_path)
    names = [item.get("schema") for item in json.loads(workload_path.read_text())]
    schemas: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(names):
        if not isinstance(name, str):
            raise WorkloadError(f"schema: {workload_path}[{index}] names no schema")
        if name not in schemas:
            path = schema_dir / f"{name}.json"
            if not path.is_file():
                raise WorkloadError(f"schema: {workload_path}[{index}] names {path}: no such file")
            schemas[name] = json.loads(path.read_text())
    return [
        StructuredRequest(request, name, schemas[name])
        for request, name in zip(requests, names, strict=True)
    ]


def load_llm(model_dir: Path, workload: list[StructuredRequest], slots: int) -> tuple[LLM, float]:
    """Room for the `slots` largest requests at once, every schema compiled; with the compile
    time."""
    plain = [item.request for item in workload]
    llm = LLM(
        model_dir,
        max_num_seqs=slots,
        block_size=BLOCK_SIZE,
        num_kv_blocks=kv_blocks_needed(plain, slots) + slots,
        num_swap_blocks=0,
    )
    firsts = {item.schema_name: item for item in workload}.values()  # one request per schema
    started = time.perf_counter()
    for item in firsts:
        llm.engine.grammars.compiled(StructuredOutputsParams(json=item.schema))
    return llm, time.perf_counter() - started


def _row(
    run_pass: Pass,
    workload: list[StructuredRequest],
    lengths: list[int],
    mode: str,
    slots: int,
    repeat: int,
    batch1: bool,
) -> Row:
    params = [item.params(mode, length) for item, length in zip(workload, lengths, strict=True)]
    timed = run_pass(params, batch1)
    tokens = sum(len(output.token_ids) for output in timed.outputs)
    checked = _check(timed.outputs, workload) if mode == "json_schema" else None
    return Row(
        mode=mode,
        slots=slots,
        repeat=repeat,
        tokens_per_s=tokens / timed.seconds,
        ms_per_token_batch1=(
            1000 * timed.batch1_seconds / max(timed.batch1_tokens, 1)
            if timed.batch1_seconds is not None
            else None
        ),
        output_tokens=tokens,
        seconds=timed.seconds,
        steps=timed.steps,
        mask_ms_per_step=(
            1000 * timed.mask_seconds / max(timed.steps, 1)
            if timed.mask_seconds is not None and timed.steps is not None
            else None
        ),
        valid=checked[0] if checked else None,
        truncated=checked[1] if checked else None,
        invalid=checked[2] if checked else None,
    )


def _engine_pass(
    llm: LLM, workload: list[StructuredRequest], params: list[SamplingParams], batch1: bool
) -> Timed:
    return _one_at_a_time(llm, workload, params) if batch1 else _all_at_once(llm, workload, params)


def _router_pass(
    address: str, workload: list[StructuredRequest], params: list[SamplingParams], batch1: bool
) -> Timed:
    prompts = [item.request.prompt for item in workload]
    if not batch1:
        outputs, seconds = asyncio.run(structured_router.all_at_once(address, prompts, params))
        return Timed([Output(*output) for output in outputs], seconds, None, None)
    outputs, seconds, decode_seconds, tokens = asyncio.run(
        structured_router.one_at_a_time(address, prompts, params)
    )
    return Timed(
        [Output(*output) for output in outputs], seconds, None, None, decode_seconds, tokens
    )


def _all_at_once(
    llm: LLM, workload: list[StructuredRequest], params: list[SamplingParams]
) -> Timed:
    """The whole workload at once."""
    engine = llm.engine
    mask_before = engine.grammars.mask_seconds
    started = time.perf_counter()
    ids = [
        engine.add_request(list(item.request.prompt), sampling)
        for item, sampling in zip(workload, params, strict=True)
    ]
    outputs, steps = _drain(llm, set(ids))
    seconds = time.perf_counter() - started
    return Timed(
        [outputs[request_id] for request_id in ids],
        seconds,
        steps,
        engine.grammars.mask_seconds - mask_before,
    )


def _one_at_a_time(
    llm: LLM, workload: list[StructuredRequest], params: list[SamplingParams]
) -> Timed:
    """Each request alone; decode seconds (first token to last) and the tokens after the first."""
    engine = llm.engine
    mask_before = engine.grammars.mask_seconds
    started = time.perf_counter()
    outputs: list[Output] = []
    steps = 0
    decode_seconds = 0.0
    tokens_after_first = 0
    for item, sampling in zip(workload, params, strict=True):
        request_id = engine.add_request(list(item.request.prompt), sampling)
        first_at = last_at = 0.0
        tokens: list[int] = []
        text = ""
        finish: FinishReason | None = None
        while finish is None:
            steps += 1
            for delta in engine.step():
                last_at = time.perf_counter()
                first_at = first_at or last_at
                tokens.extend(delta.new_token_ids)
                text += delta.text
                finish = delta.finish_reason
        outputs.append(Output(tuple(tokens), text, finish))
        assert request_id not in engine.requests
        decode_seconds += last_at - first_at
        tokens_after_first += len(tokens) - 1
    return Timed(
        outputs,
        time.perf_counter() - started,
        steps,
        engine.grammars.mask_seconds - mask_before,
        decode_seconds,
        tokens_after_first,
    )


def _drain(llm: LLM, request_ids: set[str]) -> tuple[dict[str, Output], int]:
    """Steps the engine until every request finished; each one's output and the steps taken."""
    tokens: dict[str, list[int]] = {request_id: [] for request_id in request_ids}
    texts = dict.fromkeys(request_ids, "")
    outputs: dict[str, Output] = {}
    steps = 0
    while len(outputs) < len(request_ids):
        steps += 1
        for delta in llm.engine.step():
            tokens[delta.request_id].extend(delta.new_token_ids)
            texts[delta.request_id] += delta.text
            if delta.finish_reason is not None:
                outputs[delta.request_id] = Output(
                    tuple(tokens[delta.request_id]), texts[delta.request_id], delta.finish_reason
                )
    return outputs, steps


def _check(outputs: list[Output], workload: list[StructuredRequest]) -> tuple[int, int, int]:
    """(valid, truncated, invalid) among the constrained outputs."""
    valid = truncated = invalid = 0
    for output, item in zip(outputs, workload, strict=True):
        if output.finish is FinishReason.LENGTH:
            truncated += 1
            continue
        try:
            jsonschema.validate(json.loads(output.text), item.schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            invalid += 1
    return valid, truncated, invalid
