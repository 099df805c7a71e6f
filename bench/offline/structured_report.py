"""`pdserve bench structured`'s rows (bench/offline/structured.py measures them): one per mode,
setting and repeat, printed as a line and, with --json, as JSON; and the run's summary of the
json_schema / off throughput ratios."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from typing import Any, TextIO


@dataclass(frozen=True)
class Row:
    mode: str
    slots: int
    repeat: int
    tokens_per_s: float
    ms_per_token_batch1: float | None
    output_tokens: int
    seconds: float
    steps: int | None
    mask_ms_per_step: float | None
    valid: int | None  # None when free: nothing to check
    truncated: int | None
    invalid: int | None


def report(rows: Any, conditions: dict[str, object], as_json: bool, log: TextIO) -> None:
    for row in rows:
        if as_json:
            print(json.dumps(asdict(row) | conditions), flush=True)
        print(line(row), file=log, flush=True)


def summary(
    slots: int, ratios: list[float], conditions: dict[str, object], as_json: bool, log: TextIO
) -> None:
    ratios_of = {
        "summary": "json_schema / off tokens_per_s",
        "slots": slots,
        "ratios": [round(ratio, 4) for ratio in ratios],
        "min": round(min(ratios), 4),
        "median": round(statistics.median(ratios), 4),
        "max": round(max(ratios), 4),
    }
    if as_json:
        print(json.dumps(ratios_of | conditions), flush=True)
    print(
        f"slots={slots}: json_schema / off tokens/s median {ratios_of['median']:.3f} "
        f"(min {ratios_of['min']:.3f}, max {ratios_of['max']:.3f}, {len(ratios)} repeats)",
        file=log,
        flush=True,
    )


def line(row: Row) -> str:
    batch1 = f", {row.ms_per_token_batch1:.1f} ms/token decode" if row.ms_per_token_batch1 else ""
    steps = (
        f", {row.steps} steps, mask {row.mask_ms_per_step:.2f} ms/step"
        if row.steps is not None and row.mask_ms_per_step is not None
        else ""
    )
    checked = (
        f", {row.valid} valid / {row.truncated} truncated / {row.invalid} invalid"
        if row.valid is not None
        else ""
    )
    return (
        f"{row.mode:>11} slots={row.slots:<3} {row.tokens_per_s:8.1f} tokens/s "
        f"({row.output_tokens} tokens in {row.seconds:.2f} s{steps}){batch1}{checked}"
    )
