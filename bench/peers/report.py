"""Results of `pdserve bench peers`: one record per engine and setting, and their ratios."""

from __future__ import annotations

import json
from dataclasses import dataclass

ENGINES = ("pdserve", "llama.cpp")


@dataclass(frozen=True)
class PeerResult:
    engine: str  # one of ENGINES
    slots: int
    tokens: int
    seconds: float
    loadavg_1m_before: float
    weights: str  # pdserve's dtype (or quantization/dtype), llama.cpp's GGUF type
    ms_per_token_batch1: float | None = None  # set on the --batch1 records only

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def json_line(result: PeerResult, workload: str) -> str:
    record: dict[str, object] = {
        "engine": result.engine,
        "slots": result.slots,
        "tokens_per_s": round(result.tokens_per_s, 2),
    }
    if result.ms_per_token_batch1 is not None:
        record["ms_per_token_batch1"] = round(result.ms_per_token_batch1, 2)
    else:
        record["workload"] = workload
    record |= {
        "tokens": result.tokens,
        "wall_s": round(result.seconds, 3),
        "weights": result.weights,
        "loadavg_1m_before": round(result.loadavg_1m_before, 2),
    }
    return json.dumps(record)


def report(results: list[PeerResult]) -> str:
    """A table of every result, then pdserve / llama.cpp ratios measured in this run."""
    lines = [f"{'engine':10s} {'weights':12s} {'slots':>5s} {'tok/s':>9s} {'ms/tok b1':>9s} load"]
    for r in results:
        batch1 = f"{r.ms_per_token_batch1:9.2f}" if r.ms_per_token_batch1 is not None else " " * 9
        lines.append(
            f"{r.engine:10s} {r.weights:12s} {r.slots:5d} {r.tokens_per_s:9.2f} {batch1} "
            f"{r.loadavg_1m_before:.2f}"
        )
    lines += ratio_lines(results)
    return "\n".join(lines)


def ratio_lines(results: list[PeerResult]) -> list[str]:
    """pdserve / llama.cpp throughput per slot count and for each engine's best slot count;
    for batch 1, llama.cpp's ms per token / pdserve's (above 1: pdserve is faster)."""
    lines = []
    batch1 = {r.engine: r for r in results if r.ms_per_token_batch1 is not None}
    if set(batch1) == set(ENGINES):
        ours, theirs = (
            batch1["pdserve"].ms_per_token_batch1,
            batch1["llama.cpp"].ms_per_token_batch1,
        )
        assert ours is not None and theirs is not None
        lines.append(f"batch-1 decode speed, pdserve / llama.cpp: {theirs / ours:.2f}x")
    throughput = [r for r in results if r.ms_per_token_batch1 is None]
    by_slots: dict[int, dict[str, PeerResult]] = {}
    for r in throughput:
        by_slots.setdefault(r.slots, {})[r.engine] = r
    for slots, pair in sorted(by_slots.items()):
        if set(pair) == set(ENGINES):
            ratio = pair["pdserve"].tokens_per_s / pair["llama.cpp"].tokens_per_s
            lines.append(f"{slots} slots, pdserve / llama.cpp tok/s: {ratio:.2f}x")
    best = {
        engine: max((r for r in throughput if r.engine == engine), key=lambda r: r.tokens_per_s)
        for engine in ENGINES
        if any(r.engine == engine for r in throughput)
    }
    if len(by_slots) > 1 and set(best) == set(ENGINES):
        ours_best, theirs_best = best["pdserve"], best["llama.cpp"]
        lines.append(
            f"best of each, pdserve ({ours_best.slots} slots) / llama.cpp ({theirs_best.slots}"
            f" slots): {ours_best.tokens_per_s / theirs_best.tokens_per_s:.2f}x"
        )
    return lines
