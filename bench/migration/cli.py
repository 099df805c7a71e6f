"""`pdserve bench migration`: what moving a stream off a decode worker costs, live vs re-prefill,
and how long a decode worker takes to drain.

    pdserve bench migration [--contexts 100,1000,4000] [--repeats 3] [--streams 1,4,8]
                            [--modes live,re_prefill,re_prefill_cold]
                            [--netns [--link-rate RATE]] [--json]

**Move stall.** For each context length L, repeat and mode, a fresh cluster (1 prefill and 2 decode
workers) serves one stream: a prompt of L - 8 random ordinary tokens (drawn from a seed of the
repeat's own: no prompt repeats within a run; both modes of a repeat get the same one), greedy,
EOS ignored. Once it has streamed 8 tokens (context L), the decode worker holding it gets SIGTERM
(`live`: it drains; the router suspends the stream there, its KV goes over UCX to the other
decode worker, which continues) or SIGKILL (`re_prefill`: it is lost; the router sends prompt +
streamed tokens to the prefill tier, whose KV goes to the other decode worker). The stall is
what the client sees: the longest wait between two tokens from the signal on (a draining worker
streams until the router suspends the stream, so the gap need not follow the signal at once).
In `re_prefill` the prefill worker keeps its prefix cache on, as users run it: a re-prefill finds
the prompt it prefilled at the stream's start there and computes only the streamed tokens, which
is the re-prefill a crash costs when the prompt's prefill worker still holds it. In
`re_prefill_cold` the prefill worker runs with `--no-prefix-cache`: it recomputes the whole
context, which is what a crash costs once the prompt has left the cache (or reaches another
prefill worker). Every mode must give the same tokens (`outputs_match`).

**Drain time.** For each K in `--streams`, a fresh cluster serves K endless streams of
1,000-token contexts; once each has 8 tokens, the decode worker running the most of them (`held`)
gets SIGTERM, and `drain_s` is the time until its process exits: it moves its streams live and
leaves. `streams_moved_s` is the worker's own drain (its `pdserve_drain_seconds`, held once it is
idle): SIGTERM until no stream or suspended request is left, before the server and the engine
stop. The streams are then cancelled.

**The link.** By default the cluster runs on loopback. With `--netns` (root) each process runs in
a pod of its own (`pdserve up --netns`'s `PodCluster`): KV crosses UCX over TCP on the pods'
veth links, and `--link-rate` shapes each link with tc, so the cost of moving KV over a slower
network shows against the cost of recomputing it. Re-prefill ships the same KV (prefill ->
decode) on top of recomputing it, so the link slows both modes.

With --json, one object per line: `{"context_tokens", "mode", "stall_s", "stall_ci",
"repeats", "outputs_match", "link"}` per context and mode, `{"streams", "drain_s",
"streams_moved_s", "held", "moved_live", "exit_code", "link"}` per K (seconds; `stall_ci` a
95 % Student-t interval of the mean; `link` is `loopback`, `netns` or `netns RATE`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pdserve.bench.arg_types import positive_int, positive_ints
from pdserve.bench.migration.drain import DrainRow, drain_row
from pdserve.bench.migration.harness import (
    TOKENS_BEFORE_MOVE,
    RunningCluster,
    Stream,
    link_name,
    num_running,
    random_prompt,
    running_cluster,
    serve_stream,
    until_each_has,
)
from pdserve.client import GenerationClient
from pdserve.core.model.source import resolve_model
from pdserve.local.cluster import Process
from pdserve.local.netns import link_rate


@dataclass(frozen=True)
class Move:
    """How a mode takes the stream's decode worker away."""

    signal: signal.Signals
    prefill_args: tuple[str, ...] = ()


MODES = {
    "live": Move(signal.SIGTERM),
    "re_prefill": Move(signal.SIGKILL),
    "re_prefill_cold": Move(signal.SIGKILL, ("--no-prefix-cache",)),
}
STUDENT_T_95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


@dataclass(frozen=True)
class StallRow:
    context_tokens: int
    mode: str
    stall_s: float
    stall_ci: tuple[float, float]
    repeats: int
    outputs_match: bool
    link: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder (default: the embedded one)")
    parser.add_argument(
        "--contexts",
        type=positive_ints,
        default=[100, 1000, 4000],
        metavar="N,...",
        help="context lengths (tokens) at the move",
    )
    parser.add_argument("--repeats", type=positive_int, default=3, help="moves per context, mode")
    parser.add_argument(
        "--streams",
        type=positive_ints,
        default=[1, 4, 8],
        metavar="K,...",
        help="running streams at the drain",
    )
    parser.add_argument(
        "--modes",
        type=_modes,
        default=list(MODES),
        metavar="MODE,...",
        help=f"how streams move ({', '.join(MODES)})",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed of the prompts")
    parser.add_argument(
        "--netns",
        action="store_true",
        help="each process in a pod of its own (root): KV over UCX on TCP between pods",
    )
    parser.add_argument(
        "--link-rate",
        type=link_rate,
        default=None,
        help="with --netns: each pod link's rate each way, in tc units (e.g. 100mbit)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument("--log-dir", type=Path, help="keep the workers' logs here")


def _modes(text: str) -> list[str]:
    modes = text.split(",")
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"unknown mode {unknown[0]!r}; known: {', '.join(MODES)}")
    return modes


def run(args: argparse.Namespace) -> int:
    if args.link_rate is not None and not args.netns:
        print("pdserve bench migration: --link-rate needs --netns", file=sys.stderr)
        return 2
    if args.netns and os.geteuid() != 0:
        print("pdserve bench migration: --netns needs root", file=sys.stderr)
        return 2
    model_dir = resolve_model(args.model)
    vocab_size = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    print(f"loadavg before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    for context in args.contexts:
        for row in _stall_rows(args, model_dir, vocab_size, context):
            _print(row, args.json)
    for count in args.streams:
        _print(drain_row(args, model_dir, vocab_size, count), args.json)
    print(f"loadavg after: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return 0


def _stall_rows(
    args: argparse.Namespace, model_dir: Path, vocab_size: int, context: int
) -> list[StallRow]:
    stalls: dict[str, list[float]] = {mode: [] for mode in args.modes}
    match = True
    for repeat in range(args.repeats):
        rng = random.Random(f"{args.seed}-{context}-{repeat}")
        prompt = random_prompt(rng, context - TOKENS_BEFORE_MOVE, vocab_size)
        outputs = []
        for mode in args.modes:
            move = MODES[mode]
            name = f"{mode}-{context}-{repeat}"
            with running_cluster(args, model_dir, name, move.prefill_args) as cluster:
                stream, moved_at = asyncio.run(_moved_stream(cluster, [prompt], move.signal))
                outputs.append(stream[0].tokens)
                stalls[mode].append(_worst_gap(stream[0].times, moved_at))
        match = match and all(output == outputs[0] for output in outputs)
    return [
        StallRow(context, mode, statistics.fmean(s), _interval(s), len(s), match, link_name(args))
        for mode, s in stalls.items()
    ]


async def _moved_stream(
    cluster: RunningCluster, prompts: Sequence[tuple[int, ...]], how: signal.Signals
) -> tuple[list[Stream], float]:
    """Streams the prompts; once each has TOKENS_BEFORE_MOVE tokens, the decode worker holding
    the first gets `how`. Returns what the clients saw and when the signal went."""
    streams = [Stream([], []) for _ in prompts]
    async with GenerationClient.connect(cluster.router.address) as client:
        tasks = [
            asyncio.ensure_future(serve_stream(client, prompt, stream))
            for prompt, stream in zip(prompts, streams, strict=True)
        ]
        await until_each_has(streams, TOKENS_BEFORE_MOVE)
        holder = await _holder(cluster.decode)
        moved_at = time.monotonic()
        holder.popen.send_signal(how)
        await asyncio.gather(*tasks)
    return streams, moved_at


async def _holder(workers: list[Process]) -> Process:
    """The decode worker running a request now."""
    for worker in workers:
        if await num_running(worker):
            return worker
    raise RuntimeError("no decode worker runs the stream")


def _worst_gap(times: list[float], moved_at: float) -> float:
    """The longest wait between tokens from the signal on (the signal counts as the first):
    a draining worker goes on streaming until the router suspends the stream, so the move's
    gap comes after a few tokens, not at the first one."""
    after = [moved_at, *(t for t in times if t > moved_at)]
    return max(b - a for a, b in itertools.pairwise(after))


def _interval(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean
    half = STUDENT_T_95.get(len(values) - 1, 1.96) * statistics.stdev(values) / len(values) ** 0.5
    return mean - half, mean + half


def _print(row: StallRow | DrainRow, as_json: bool) -> None:
    if as_json:
        print(json.dumps(asdict(row)), flush=True)
    else:
        print(row, flush=True)
