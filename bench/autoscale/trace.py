"""The shifting load of `pdserve bench autoscale`: phases one after another, each a Poisson
process at its own rate over its own request mix (classes as `bench disagg` reads them, per-class
TTFT SLOs included).

    {"phases": [{"name": "chat-low", "seconds": 360, "rate": 0.1,
                 "classes": [{"name": "chat", "weight": 1, "prompt_tokens": {...}, ...}]}, ...]}

The shipped trace (bench/workloads/autoscale-shift.json) is `pdserve bench make-autoscale-trace`'s
default: chat-heavy at a low rate, a surge of long prompts, chat-heavy at a high rate, then
quiet, six minutes each; `--minutes` scales every phase's length alike (the rates stay).

    pdserve bench make-autoscale-trace [--minutes 24] [--out FILE]

Rates and SLOs are sized for four 0.5-CPU pods on a 2-core host of this project's kind (PHASES
says how): the simulator predicted that the busy phases need four of them, in different splits,
and the quiet ones two; measured on the full trace, three (2P1D) attain every phase
(docs/autoscaling.md).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.bench.disagg.workload import (
    PlannedRequest,
    RequestClass,
    TtftSlo,
    parse_spec,
    plan_requests,
    point_seed,
)

SHIPPED = Path(__file__).resolve().parents[1] / "workloads" / "autoscale-shift.json"
DEFAULT_MINUTES = 24.0

# One TTFT SLO for every class, growing with the prompt: a half-core prefill pod of this engine
# takes about 10-13 ms a prompt token (1 + 15 ms/token is 1.25x that for a 1,000-token prompt,
# 2.5x for a 200-token one). The autoscaler takes one formula, and sizes for exactly this one.
TTFT_SLO = {"seconds": 1.0, "per_prompt_token": 0.015}
CHAT = {
    "name": "chat",
    "prompt_tokens": {"min": 20, "max": 200},
    "output_tokens": {"min": 50, "max": 200},
    "ttft_slo": TTFT_SLO,
}
LONG = {
    "name": "long",
    "prompt_tokens": {"min": 400, "max": 1000},
    "output_tokens": {"min": 20, "max": 60},
    "ttft_slo": TTFT_SLO,
}
# (name, share of the trace's length, requests/s, chat weight, long weight). Sized before any
# run of this trace by the simulator (the autoscaler's own evaluation) at 0.5-CPU pods with the
# corrections the previous bench run measured (prefill 1.45x, decode 1.2x the profile): the quiet
# and low phases need 1P1D, the surge of long prompts 2P1D or more prefill, the high chat phase
# 2P2D; 2P2D is the one fixed shape of four pods predicted to attain 0.9 in every phase.
PHASES = (
    ("chat-low", 0.25, 0.1, 0.95, 0.05),
    ("long-surge", 0.25, 0.07, 0.4, 0.6),
    ("chat-high", 0.25, 0.5, 0.95, 0.05),
    ("quiet", 0.25, 0.02, 0.95, 0.05),
)


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    rate: float  # requests/s
    classes: tuple[RequestClass, ...]

    @property
    def requests(self) -> int:
        return max(1, round(self.rate * self.seconds))

    def plan(self, vocab_size: int, seed: int) -> tuple[PlannedRequest, ...]:
        """Its requests, the same for every arm (fresh prompts, no repeats across phases)."""
        label = point_seed(seed, f"autoscale/{self.name}")
        return plan_requests(self.classes, self.requests, vocab_size, label)


def tightest_ttft_slo(phases: Sequence[Phase]) -> TtftSlo:
    """One TTFT SLO formula for every request of the trace, no looser than any class's: what the
    autoscaler sizes for (it takes one; the shipped trace's classes share theirs)."""
    slos = [request_class.ttft_slo for phase in phases for request_class in phase.classes]
    return TtftSlo(min(slo.seconds for slo in slos), min(slo.per_prompt_token for slo in slos))


def make_trace(minutes: float = DEFAULT_MINUTES) -> dict[str, Any]:
    phases = []
    for name, share, rate, chat, long in PHASES:
        classes = [{**CHAT, "weight": chat}, {**LONG, "weight": long}]
        phases.append(
            {"name": name, "seconds": share * minutes * 60, "rate": rate, "classes": classes}
        )
    return {"phases": phases}


def parse_trace(raw: Any) -> tuple[Phase, ...]:
    """ValueError names the bad field."""
    phases = raw.get("phases") if isinstance(raw, dict) else None
    if not isinstance(phases, list) or not phases:
        raise ValueError("phases: must be a non-empty list")
    return tuple(_phase(item, f"phases[{index}]") for index, item in enumerate(phases))


def _phase(item: Any, where: str) -> Phase:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise ValueError(f"{where}.name: must be a string")
    numbers = {}
    for key in ("seconds", "rate"):
        value = item.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{where}.{key}: must be a number > 0")
        numbers[key] = float(value)
    try:
        classes = parse_spec({"classes": item.get("classes")})
    except ValueError as error:
        raise ValueError(f"{where}.{error}") from error
    return Phase(item["name"], numbers["seconds"], numbers["rate"], classes)


def load_trace(path: Path | None) -> tuple[Phase, ...]:
    return parse_trace(json.loads((path or SHIPPED).read_text()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES, help="the whole trace")
    parser.add_argument("--out", type=Path, default=SHIPPED, help="where to write it")


def run(args: argparse.Namespace) -> int:
    if not args.minutes > 0:
        print("pdserve bench make-autoscale-trace: --minutes must be > 0")
        return 2
    args.out.write_text(json.dumps(make_trace(args.minutes), indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0
