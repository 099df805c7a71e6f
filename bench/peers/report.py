"""Results of `pdserve bench peers`: one record per engine and setting, and their ratios."""

from __future__ import annotations

import json
from collections.abc import Callable
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
    speculative: str = "off"  # pdserve's method ("ngram") or llama-server's --spec-type
    acceptance_rate: float | None = None  # drafts kept / drafted, when it speculated
    flags: tuple[str, ...] = ()  # llama.cpp's flags beyond the harness's own (llama.py Peer)

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
    record["speculative"] = result.speculative
    if result.acceptance_rate is not None:
        record["acceptance_rate"] = round(result.acceptance_rate, 4)
    record |= {
        "tokens": result.tokens,
        "wall_s": round(result.seconds, 3),
        "weights": result.weights,
        "loadavg_1m_before": round(result.loadavg_1m_before, 2),
    }
    if result.flags:
        record["flags"] = " ".join(result.flags)
    return json.dumps(record)


def report(results: list[PeerResult]) -> str:
    """A table of every result, then pdserve / llama.cpp ratios measured in this run."""
    lines = [
        f"{'engine':10s} {'weights':12s} {'spec':13s} {'slots':>5s} {'tok/s':>9s} "
        f"{'ms/tok b1':>9s} {'kept':>5s} load"
    ]
    for r in results:
        batch1 = f"{r.ms_per_token_batch1:9.2f}" if r.ms_per_token_batch1 is not None else " " * 9
        kept = f"{r.acceptance_rate:5.2f}" if r.acceptance_rate is not None else " " * 5
        lines.append(
            f"{r.engine:10s} {r.weights:12s} {r.speculative:13s} {r.slots:5d} "
            f"{r.tokens_per_s:9.2f} {batch1} {kept} {r.loadavg_1m_before:.2f}"
        )
    lines += ratio_lines(results)
    return "\n".join(lines)


def ratio_lines(results: list[PeerResult]) -> list[str]:
    """pdserve / llama.cpp throughput per slot count and for each engine's best slot count;
    for batch 1, llama.cpp's ms per token / pdserve's (above 1: pdserve is faster). Where an
    engine ran several ways (llama-server's speculation types), its best run of a setting counts."""
    lines = []
    batch1 = _best_by_engine(
        [r for r in results if r.ms_per_token_batch1 is not None], _batch1_speed
    )
    if set(batch1) == set(ENGINES):
        ours, theirs = batch1["pdserve"], batch1["llama.cpp"]
        lines.append(
            f"batch-1 decode speed, pdserve{_spec(ours)} / llama.cpp{_spec(theirs)}: "
            f"{_batch1_speed(ours) / _batch1_speed(theirs):.2f}x"
        )
    throughput = [r for r in results if r.ms_per_token_batch1 is None]
    slot_counts = sorted({r.slots for r in throughput})
    for slots in slot_counts:
        pair = _best_by_engine([r for r in throughput if r.slots == slots], _tokens_per_s)
        if set(pair) == set(ENGINES):
            ours, theirs = pair["pdserve"], pair["llama.cpp"]
            lines.append(
                f"{slots} slots, pdserve{_spec(ours)} / llama.cpp{_spec(theirs)} tok/s: "
                f"{ours.tokens_per_s / theirs.tokens_per_s:.2f}x"
            )
    best = _best_by_engine(throughput, _tokens_per_s)
    if len(slot_counts) > 1 and set(best) == set(ENGINES):
        ours_best, theirs_best = best["pdserve"], best["llama.cpp"]
        lines.append(
            f"best of each, pdserve ({ours_best.slots} slots) / llama.cpp ({theirs_best.slots}"
            f" slots): {ours_best.tokens_per_s / theirs_best.tokens_per_s:.2f}x"
        )
    return lines


def _tokens_per_s(result: PeerResult) -> float:
    return result.tokens_per_s


def _batch1_speed(result: PeerResult) -> float:
    assert result.ms_per_token_batch1 is not None
    return 1.0 / result.ms_per_token_batch1


def _best_by_engine(
    results: list[PeerResult], speed: Callable[[PeerResult], float]
) -> dict[str, PeerResult]:
    best: dict[str, PeerResult] = {}
    for result in results:
        if result.engine not in best or speed(result) > speed(best[result.engine]):
            best[result.engine] = result
    return best


def _spec(result: PeerResult) -> str:
    return "" if result.speculative == "off" else f" ({result.speculative})"
