"""`pdserve simulate --validate`: the simulator against the real cluster, on this machine.

For each configuration (`1P1D`: prefill pinned to core 0, decode to core 1; `1P2D`: both decode
workers share core 1; `2P1D`: both prefill workers share core 0) it starts the real router and
workers (`pdserve/cluster.py`), warms them up, and at each rate drives `pdserve loadtest` with the
workload's requests as GenerateStream calls started at i / rate (the load runner's constant
schedule, so the rates are whole numbers, as ghz's `rps` is); then it simulates the same trace
with the profile and prints, per configuration, rate and metric, the real and simulated values
and error = |sim - real| / real.

Two simulations per point. `sim` is given the core share each worker's engine thread actually got
during the run (`cpu_share`, from schedstat: on this shared machine, how much CPU other processes
left is an input of the run, not something the simulator can predict) and the profile's CPU-time
model unscaled. `sim_profiled` uses only what is known beforehand: the profile's wall/CPU ratio
and an even split of a core among the workers pinned to it.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from pdserve.cluster import Cluster, ClusterSpec, CpuPin
from pdserve.core.config import EngineConfig
from pdserve.core.model.source import resolve_model
from pdserve.planner import cpu_share
from pdserve.planner.profile import Profile
from pdserve.planner.sim_cluster import ClusterSim, Deployment
from pdserve.planner.sim_report import summarize
from pdserve.planner.workload import PoissonSpec, TraceRequest, Workload, requests_of

METRICS = ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "throughput")
BASE_PORT, METRICS_PORT = 53000, 53500  # clear of `pdserve up`'s 50051 / 9100
FIRST_ID, VOCAB = 100, 49152  # random prompt ids: SmolLM2's vocabulary without its special ids


def run_validation(
    args: argparse.Namespace, profile: Profile, workload: Workload, engine: EngineConfig
) -> int:
    rates = _rates(args.rates, workload)
    configs = [_parse_config(name) for name in args.configs.split(",")]
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="pdserve-validate-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    traces = {rate: validation_trace(workload, rate, args.traffic_s) for rate in rates}
    lines: list[dict[str, Any]] = []
    for num_prefill, num_decode in configs:
        name = f"{num_prefill}P{num_decode}D"
        real = run_real(resolve_model(args.model), num_prefill, num_decode, engine, traces, out_dir)
        for rate, trace in traces.items():
            run = real[rate]
            shares = (run["prefill_share"], run["decode_share"])
            sim = simulated(replace(profile, contention=1.0), num_prefill, num_decode, engine,
                            trace, shares)  # fmt: skip
            even = (1.0 / num_prefill, 1.0 / num_decode)
            profiled = simulated(profile, num_prefill, num_decode, engine, trace, even)
            for metric in METRICS:
                line = {"config": name, "rate": rate, "metric": metric, "real": run[metric],
                        "sim": sim[metric], "error": _error(sim[metric], run[metric]),
                        "sim_profiled": profiled[metric],
                        "error_profiled": _error(profiled[metric], run[metric]),
                        "prefill_share": shares[0], "decode_share": shares[1],
                        "loadavg": run["loadavg"]}  # fmt: skip
                print(json.dumps(line) if args.json else _text(line), flush=True)
                lines.append(line)
    if args.plot:
        plot_fidelity(lines, args.plot)
    return 0


def plot_fidelity(lines: list[dict[str, Any]], path: Path) -> None:
    """One panel per metric: real (solid) and simulated (dashed) against rate, per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.5))
    for axis, metric in zip(axes, METRICS, strict=True):
        for config in sorted({line["config"] for line in lines}):
            rows = [x for x in lines if x["metric"] == metric and x["config"] == config]
            rates = [x["rate"] for x in rows]
            (real,) = axis.plot(rates, [x["real"] for x in rows], "o-", label=f"{config} real")
            axis.plot(rates, [x["sim"] for x in rows], "x--", color=real.get_color(),
                      label=f"{config} sim")  # fmt: skip
        axis.set_title(metric)
        axis.set_xlabel("requests/s")
    axes[0].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _rates(text: str | None, workload: Workload) -> list[int]:
    if text is None:
        base = round(workload.rate) if isinstance(workload, PoissonSpec) else 1
        return [max(base - 1, 1), max(base, 2), max(base + 1, 3)]
    rates = [int(part) for part in text.split(",")]
    if len(rates) != 3 or min(rates) < 1:
        raise ValueError(f"--rates: three whole numbers >= 1, got {text!r}")
    return rates


def _parse_config(name: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d)P(\d)D", name.strip())
    if match is None or name.strip() not in ("1P1D", "1P2D", "2P1D"):
        raise ValueError(f"--configs: each one of 1P1D, 1P2D, 2P1D, got {name!r}")
    return int(match[1]), int(match[2])


def validation_trace(workload: Workload, rate: int, traffic_s: float) -> list[TraceRequest]:
    """The workload's lengths, in order, arriving every 1 / rate seconds (the runner's schedule)."""
    lengths = requests_of(workload)
    count = int(rate * traffic_s)
    return [
        TraceRequest(i / rate, lengths[i % len(lengths)].prompt_tokens,
                     lengths[i % len(lengths)].output_tokens)
        for i in range(count)
    ]  # fmt: skip


def simulated(
    profile: Profile, num_prefill: int, num_decode: int, engine: EngineConfig,
    trace: list[TraceRequest], shares: tuple[float, float],
) -> dict[str, float]:  # fmt: skip
    deployment = Deployment(
        num_prefill, num_decode, engine, engine, prefill_share=shares[0], decode_share=shares[1]
    )
    summary = summarize(ClusterSim(deployment, profile).run(trace))
    return {**summary, "throughput": summary["throughput_tokens_per_s"]}


def run_real(
    model_dir: Path, num_prefill: int, num_decode: int, engine: EngineConfig,
    traces: dict[int, list[TraceRequest]], out_dir: Path,
) -> dict[int, dict[str, Any]]:  # fmt: skip
    pins = tuple(CpuPin("prefill", i, (0,)) for i in range(num_prefill)) + tuple(
        CpuPin("decode", i, (1,)) for i in range(num_decode)
    )
    spec = ClusterSpec(
        model_dir, num_prefill, num_decode, BASE_PORT, METRICS_PORT,
        worker_args=_engine_flags(engine), pins=pins,
    )  # fmt: skip
    name = f"{num_prefill}P{num_decode}D"
    results: dict[int, dict[str, Any]] = {}
    with Cluster(spec, log_dir=out_dir / f"{name}-logs") as cluster:
        cluster.wait_ready()
        warm_up = [TraceRequest(0.0, 16, 4)] * 2
        _load(warm_up, 1, cluster.router.address, out_dir / f"{name}-warmup")
        for rate, trace in traces.items():
            loadavg = Path("/proc/loadavg").read_text().split()[:3]
            workers = {p: cpu_share.snapshot(p.popen.pid) for p in cluster.prefill + cluster.decode}
            report = _load(trace, rate, cluster.router.address, out_dir / f"{name}-r{rate}")
            shares = {p: cpu_share.engine_share(s, cpu_share.snapshot(p.popen.pid))
                      for p, s in workers.items()}  # fmt: skip
            results[rate] = {
                **real_metrics(report),
                "loadavg": " ".join(loadavg),
                "prefill_share": _mean([s for p, s in shares.items() if p.role == "prefill"]),
                "decode_share": _mean([s for p, s in shares.items() if p.role == "decode"]),
            }
    return results


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _engine_flags(engine: EngineConfig) -> tuple[str, ...]:
    flags = ("block_size", "num_kv_blocks", "num_swap_blocks", "max_num_seqs",
             "max_num_batched_tokens")  # fmt: skip
    return tuple(
        part for flag in flags
        for part in (f"--{flag.replace('_', '-')}", str(getattr(engine, flag)))
    )  # fmt: skip


def _load(trace: list[TraceRequest], rate: int, host: str, stem: Path) -> dict[str, Any]:
    """Runs `pdserve loadtest` on a config made from the trace; returns its report."""
    rng = random.Random(0)
    data = [
        {"prompt_token_ids": {"ids": _prompt(rng, r.prompt_tokens)},
         "sampling": {"max_tokens": r.output_tokens, "temperature": 0, "ignore_eos": True}}
        for r in trace
    ]  # fmt: skip
    config = {
        "call": "pdserve.v1.Generation.GenerateStream", "host": host, "insecure": True,
        "rps": rate, "total": len(trace), "concurrency": 512, "timeout": "600s", "data": data,
    }  # fmt: skip
    config_path, report_path = stem.with_suffix(".config.json"), stem.with_suffix(".report.json")
    config_path.write_text(json.dumps(config))
    command = [sys.executable, "-m", "pdserve", "loadtest", str(config_path), "-q",
               "-o", str(report_path)]  # fmt: skip
    subprocess.run(command, check=True)
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(FIRST_ID, VOCAB) for _ in range(length)]


def real_metrics(report: dict[str, Any]) -> dict[str, float]:
    generation = report["generation"]
    metrics = {"throughput": float(generation["outputTokensPerSecond"])}
    for name, key in (("ttft", "timeToFirstToken"), ("itl", "interTokenLatency")):
        marks = {m["percentage"]: m["latency"] for m in generation[key]["latencyDistribution"]}
        metrics[f"{name}_p50"], metrics[f"{name}_p90"] = marks[50] / 1e9, marks[90] / 1e9
    return metrics


def _error(sim: float, real: float) -> float:
    return abs(sim - real) / real if real else float("inf")


def _text(line: dict[str, Any]) -> str:
    return (
        f"{line['config']:5} rate {line['rate']}/s {line['metric']:11} real {line['real']:9.4f} "
        f"sim {line['sim']:9.4f} error {line['error']:6.1%} | profiled {line['sim_profiled']:9.4f}"
        f" error {line['error_profiled']:6.1%} (shares {line['prefill_share']:.2f}/"
        f"{line['decode_share']:.2f}, load {line['loadavg']})"
    )
