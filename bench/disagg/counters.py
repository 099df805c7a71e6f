"""What the cluster counted while a point ran: snapshots of the processes' /metrics, and deltas.

Placements come from the router's `pdserve_router_prefill_placements_total{place,reason}`;
prefix-cache hits from each worker's `pdserve_{prefill,decode}_prefix_cache_hit_tokens` (summed
over workers: in a split arm a shared prefix may count on both tiers, once as prompt tokens
prefill did not compute and once as KV decode did not receive).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from pdserve.bench.disagg.report import PointCounters
from pdserve.local.cluster import Process

PLACEMENTS = "pdserve_router_prefill_placements"
ITL = "pdserve_decode_inter_token_latency_seconds"  # each worker's gaps between its tokens
HIT_TOKENS = ("pdserve_prefill_prefix_cache_hit_tokens", "pdserve_decode_prefix_cache_hit_tokens")


@dataclass(frozen=True)
class Snapshot:
    placements: dict[str, float]
    reasons: dict[str, float]  # "place:reason"
    prefix_hit_tokens: float
    itl: dict[str, tuple[float, float]]  # worker name -> (sum of gaps, s; count)

    def since(self, earlier: Snapshot) -> PointCounters:
        return PointCounters(
            placements=_delta(self.placements, earlier.placements),
            reasons={k: v for k, v in _delta(self.reasons, earlier.reasons).items() if v},
            prefix_hit_tokens=round(self.prefix_hit_tokens - earlier.prefix_hit_tokens),
            itl={
                name: (total - earlier.itl[name][0], count - earlier.itl[name][1])
                for name, (total, count) in self.itl.items()
            },
        )


def _delta(now: dict[str, float], earlier: dict[str, float]) -> dict[str, int]:
    return {key: round(count - earlier.get(key, 0.0)) for key, count in now.items()}


def snapshot(router: Process, workers: Sequence[Process]) -> Snapshot:
    placements: dict[str, float] = {"local": 0.0, "remote": 0.0}
    reasons: dict[str, float] = {}
    for sample in _samples(router):
        if sample.name == f"{PLACEMENTS}_total":
            place = sample.labels["place"]
            placements[place] = placements.get(place, 0.0) + sample.value
            reason = f"{place}:{sample.labels['reason']}"
            reasons[reason] = reasons.get(reason, 0.0) + sample.value
    hits = 0.0
    itl: dict[str, tuple[float, float]] = {}
    for worker in workers:
        samples = _samples(worker)
        hits += sum(sample.value for sample in samples if sample.name in HIT_TOKENS)
        total = sum(sample.value for sample in samples if sample.name == f"{ITL}_sum")
        count = sum(sample.value for sample in samples if sample.name == f"{ITL}_count")
        itl[worker.name] = (total, count)
    return Snapshot(placements, reasons, hits, itl)


def _samples(process: Process) -> list[Sample]:
    url = f"http://127.0.0.1:{process.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
