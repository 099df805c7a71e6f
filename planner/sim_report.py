"""What a simulation says: latency percentiles, throughput, KV usage and queues, and a plot.

Percentiles use the load runner's rule (ghz's rank rule, `loadtest/stats.py`), so a simulated
p90 and a measured p90 are the same statistic. ITL is every gap between consecutive tokens of a
request (the router streams one chunk per decode step), as the load runner measures it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdserve.loadtest.stats import percentile
from pdserve.planner.sim_cluster import SimResult
from pdserve.planner.sim_worker import Journey

PERCENTS = (50, 90, 99)


def summarize(result: SimResult) -> dict[str, Any]:
    done = [j for j in result.journeys if len(j.token_times) == j.output_tokens]
    ttft = [j.token_times[0] - j.arrival_s for j in done]
    itl = [b - a for j in done for a, b in zip(j.token_times, j.token_times[1:], strict=False)]
    e2e = [j.token_times[-1] - j.arrival_s for j in done]
    start = min((j.arrival_s for j in result.journeys), default=0.0)
    span = max((j.token_times[-1] for j in done), default=start) - start
    tokens = sum(len(j.token_times) for j in done)
    summary: dict[str, Any] = {
        "requests": len(result.journeys),
        "refused": sum(j.refused for j in result.journeys),
        "completed": len(done),
        "output_tokens": tokens,
        "throughput_tokens_per_s": tokens / span if span > 0 else 0.0,
        "ttft_mean": sum(ttft) / len(ttft) if ttft else 0.0,
        "steps": result.num_steps,
        "preemptions": result.num_preemptions,
        # Prompt tokens looked up in the workers' prefix caches (both tiers) and found there.
        "prefix_query_tokens": result.prefix_query_tokens,
        "prefix_hit_tokens": result.prefix_hit_tokens,
    }
    for name, values in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
        summary.update(_percentiles(name, values))
    usage = result.usage
    summary["kv_used_max"] = max((u.kv_used for u in usage), default=0.0)
    summary["queue_max"] = max((u.waiting for u in usage), default=0)
    return summary


def _percentiles(name: str, seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {f"{name}_p{p}": 0.0 for p in PERCENTS}
    ordered_ns = sorted(round(value * 1e9) for value in seconds)
    return {f"{name}_p{p}": percentile(ordered_ns, p) / 1e9 for p in PERCENTS}


def format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"requests {summary['requests']} (completed {summary['completed']}, refused "
        f"{summary['refused']}), "
        f"{summary['output_tokens']} output tokens, "
        f"{summary['throughput_tokens_per_s']:.2f} tokens/s, {summary['steps']} steps, "
        f"{summary['preemptions']} preemptions"
    ]
    for name in ("ttft", "itl", "e2e"):
        values = ", ".join(f"p{p} {summary[f'{name}_p{p}'] * 1e3:.1f} ms" for p in PERCENTS)
        lines.append(f"{name.upper():5} {values}")
    lines.append(
        f"KV used at most {summary['kv_used_max']:.0%}, longest queue {summary['queue_max']}, "
        f"prefix caches held {summary['prefix_hit_tokens']} of "
        f"{summary['prefix_query_tokens']} prompt tokens looked up"
    )
    return "\n".join(lines)


def plot(result: SimResult, path: Path) -> None:
    """TTFT and e2e over arrival time; KV usage and queue length per worker over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (latency, kv, queue) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    done = [j for j in result.journeys if j.token_times]
    latency.plot([j.arrival_s for j in done], [_ttft(j) for j in done], ".", label="TTFT")
    latency.plot(
        [j.arrival_s for j in done],
        [j.token_times[-1] - j.arrival_s for j in done],
        ".",
        label="end to end",
    )
    latency.set_ylabel("seconds")
    latency.legend()
    for worker in sorted({u.worker for u in result.usage}):
        samples = [u for u in result.usage if u.worker == worker]
        times = [u.time for u in samples]
        kv.plot(times, [u.kv_used for u in samples], label=worker)
        queue.plot(times, [u.waiting for u in samples], label=worker)
    kv.set_ylabel("KV blocks used")
    queue.set_ylabel("queued requests")
    queue.set_xlabel("simulated time (s)")
    if len({u.worker for u in result.usage}) <= 8:
        kv.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _ttft(journey: Journey) -> float:
    return journey.token_times[0] - journey.arrival_s
