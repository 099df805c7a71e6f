"""`pdserve up`: router + prefill + decode workers on 127.0.0.1 (or each in a pod of its own on a
bridge, `--netns`) until Ctrl-C."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pdserve.core.config import SPECULATIVE_METHODS, EngineConfig
from pdserve.core.serving.cli_config import add_flag, add_model_arguments
from pdserve.costmodel.host_profile import host_profile
from pdserve.local.cluster import Cluster, ClusterSpec
from pdserve.local.cpu_limit import pod_cpus
from pdserve.local.netns import LinkShaping, link_delay, link_rate
from pdserve.router.placement.prefill_place import PlacementMode
from pdserve.router.placement.worker_choice import RoutingPolicy

if TYPE_CHECKING:
    from pdserve.local.pods import PodCluster
    from pdserve.local.status import ClusterStatus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument(
        "--prefill", type=int, default=1, help="prefill workers (0: colocated, decode prefills)"
    )
    parser.add_argument("--decode", type=int, default=1, help="decode workers")
    parser.add_argument("--port", type=int, default=50051, help="router port; workers follow it")
    parser.add_argument("--metrics-port", type=int, default=9100, help="router metrics port")
    parser.add_argument(
        "--http-port", type=int, default=8000, help="router OpenAI HTTP port (0 = off)"
    )
    add_flag(parser, "--log-dir", Path, None, "write each process's log here (default: discard)")
    add_flag(
        parser,
        "--drain-grace-seconds",
        float,
        ClusterSpec.drain_grace_seconds,
        "how long each process may drain on SIGTERM (also a worker `pdserve scale` removes)",
    )
    add_flag(
        parser,
        "--disagg-threshold",
        int,
        0,
        "the router's rule: prompts shorter than this are prefilled on decode (0: never)",
    )
    add_flag(
        parser,
        "--placement",
        str,
        PlacementMode.THRESHOLD.value,
        "the router's placement: threshold (--disagg-threshold) or adaptive (the cost model "
        "of --profile chooses where each prompt is prefilled and decoded; docs/router.md)",
        choices=[mode.value for mode in PlacementMode],
    )
    add_flag(
        parser,
        "--profile",
        Path,
        None,
        "cost model from `pdserve profile` for --placement adaptive and --itl-slo (default: this "
        "host's, measured on the first such start and cached; costmodel/host_profile.py)",
    )
    add_flag(
        parser,
        "--itl-slo",
        float,
        None,
        "seconds: every worker caps a decoding step's prompt tokens to stay within it, and the "
        "router predicts with it (with --profile or this host's; default: off)",
    )
    add_flag(
        parser,
        "--itl-slo-mode",
        str,
        "step",
        "what every worker's --itl-slo bounds: step (every step) or mean (each stream's mean "
        "gap; docs/router.md)",
        choices=["step", "mean"],
    )
    add_flag(
        parser,
        "--routing-policy",
        str,
        RoutingPolicy.LEAST_LOADED.value,
        "the router's worker choice: least-loaded, or prefix (prefer recent prompt prefixes)",
        choices=[policy.value for policy in RoutingPolicy],
    )
    add_flag(
        parser,
        "--speculative",
        str,
        "off",
        "the decode workers' speculative decoding: off, or ngram (drafts from each request's "
        "own context; docs/speculative.md)",
        choices=list(SPECULATIVE_METHODS),
    )
    add_flag(
        parser,
        "--num-speculative-tokens",
        int,
        EngineConfig().num_speculative_tokens,
        "most drafted tokens each request verifies per step (with --speculative ngram)",
    )
    group = parser.add_argument_group("pods on one machine (docs/elasticity.md)")
    group.add_argument(
        "--netns",
        action="store_true",
        help="every process in its own network namespace on a bridge (root), workers found "
        "through DNS, KV over UCX on TCP; `pdserve scale` changes the worker counts",
    )
    group.add_argument(
        "--link-rate",
        type=link_rate,
        default=None,
        help="with --netns: each pod link's rate each way, in tc units (e.g. 1gbit)",
    )
    group.add_argument(
        "--link-delay",
        type=link_delay,
        default=None,
        help="with --netns: each pod link's added delay each way, in tc units (e.g. 1ms; "
        "needs the kernel's netem qdisc)",
    )
    group.add_argument(
        "--pod-cpus",
        type=pod_cpus,
        default=None,
        help="with --netns: each worker pod's CPU limit in cores (a CPU cgroup's CFS quota, "
        "torch threads = ceil(C)), as resources.limits.cpu on Kubernetes; default: none",
    )
    parser.add_argument(
        "worker_args", nargs=argparse.REMAINDER, help="after --: engine flags for every worker"
    )


def run(args: argparse.Namespace) -> int:
    from pdserve.core.model.source import resolve_model

    if args.prefill < 0 or args.decode < 1:
        print("pdserve up: --prefill must be >= 0 and --decode >= 1", file=sys.stderr)
        return 2
    shaping = LinkShaping(rate=args.link_rate, delay=args.link_delay)
    if (shaping.enabled or args.pod_cpus is not None) and not args.netns:
        print("pdserve up: --link-rate, --link-delay and --pod-cpus need --netns", file=sys.stderr)
        return 2
    if args.netns and os.geteuid() != 0:
        print("pdserve up: --netns needs root (network namespaces, a bridge)", file=sys.stderr)
        return 2
    model_dir = resolve_model(args.model, args.model_cache)  # prepared once, before the workers
    worker_args = tuple(a for a in args.worker_args if a != "--")
    profile = args.profile
    if profile is None and (args.placement == PlacementMode.ADAPTIVE.value or args.itl_slo):
        try:  # this host's, measured on the first such start
            from pdserve.core.model.forward import cpu_float32_forward  # torch: only here

            dtype = _worker_flag(worker_args, "--dtype", "float32")
            profile = host_profile(model_dir, dtype, cpu_float32_forward())
        except subprocess.CalledProcessError as error:
            print(f"pdserve up: profiling this host failed ({error})", file=sys.stderr)
            return 1
    cost_args = _cost_model_args(args, profile, worker_args)
    spec = ClusterSpec(
        model_dir=model_dir,
        num_prefill=args.prefill,
        num_decode=args.decode,
        base_port=args.port,
        metrics_base_port=args.metrics_port,
        worker_args=(*cost_args.worker, *worker_args),
        decode_args=(
            "--speculative",
            args.speculative,
            "--num-speculative-tokens",
            str(args.num_speculative_tokens),
        ),
        router_args=(
            "--disagg-threshold",
            str(args.disagg_threshold),
            "--routing-policy",
            args.routing_policy,
            "--placement",
            args.placement,
            *cost_args.router,
        ),
        http_port=args.http_port,
        drain_grace_seconds=args.drain_grace_seconds,
    )
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.netns:
        return _serve_pods(spec, shaping, args, stop)
    with Cluster(spec, args.log_dir) as cluster:
        print(f"starting {args.prefill} prefill + {args.decode} decode workers ...", flush=True)
        cluster.wait_ready()
        print(
            f"ready: pdserve.v1.Generation on {cluster.router.address} (Ctrl-C stops)", flush=True
        )
        if args.http_port:
            print(f"       OpenAI HTTP API on {cluster.http_url}/v1", flush=True)
        print('try:   pdserve generate --stream --chat "Tell me about Paris"', flush=True)
        while not stop.wait(0.5):
            dead = [p for p in cluster.processes if p.popen.poll() is not None]
            if dead:
                print(f"{dead[0].role}-{dead[0].index} exited; stopping", file=sys.stderr)
                return 1
        print("stopping (draining in-flight requests) ...", flush=True)
    return 0


def _serve_pods(
    spec: ClusterSpec, shaping: LinkShaping, args: argparse.Namespace, stop: threading.Event
) -> int:
    """`pdserve up --netns`: the pods, their DNS and the scale endpoint, until Ctrl-C."""
    from pdserve.local.pods import PodCluster  # dnslib: only under --netns
    from pdserve.local.scale_control import ControlServer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        cluster = PodCluster(spec, shaping, args.log_dir, pod_cpus=args.pod_cpus)
        control = ControlServer(spec.base_port, functools.partial(_answer_scale, cluster))
    except OSError as error:
        print(f"pdserve up: {error}", file=sys.stderr)
        return 1
    print(f"starting {args.prefill} prefill + {args.decode} decode workers in pods ...", flush=True)
    try:
        with cluster:
            control.start()
            print(f"ready: pdserve.v1.Generation on {cluster.router.address} (Ctrl-C stops)")
            if args.http_port:
                print(f"       OpenAI HTTP API on {cluster.http_url}/v1")
            print(f"scale: pdserve scale --port {spec.base_port} --decode N", flush=True)
            while not stop.wait(0.5):
                if cluster.reconcile() is not None:
                    print("the router exited; stopping", file=sys.stderr)
                    return 1
            print("stopping (draining in-flight requests) ...", flush=True)
    except (RuntimeError, OSError) as error:  # NetnsError, CpuLimitError, a worker that died ...
        print(f"pdserve up: {error}", file=sys.stderr)
        return 1
    finally:
        control.close()
    return 0


def _answer_scale(cluster: PodCluster, desired: dict[str, int]) -> ClusterStatus:
    """A status request (no counts) or a scale request, as `pdserve scale` sends them."""
    return cluster.scale(desired) if desired else cluster.status()


@dataclass(frozen=True)
class CostModelArgs:
    worker: tuple[str, ...]
    router: tuple[str, ...]


def _cost_model_args(
    args: argparse.Namespace, profile: Path | None, worker_args: tuple[str, ...]
) -> CostModelArgs:
    """The profile and ITL SLO for every process; the router also learns the workers' token
    budget a step (adaptive placement predicts their prompt chunks with it)."""
    if profile is None:
        return CostModelArgs((), ())
    shared: tuple[str, ...] = ("--profile", str(profile.resolve()))
    if args.itl_slo is not None:
        shared += ("--itl-slo", str(args.itl_slo))
    budget = "--max-num-batched-tokens"
    router = shared
    if budget in worker_args[:-1]:
        router += (budget, _worker_flag(worker_args, budget, ""))
    return CostModelArgs((*shared, "--itl-slo-mode", args.itl_slo_mode), router)


def _worker_flag(worker_args: tuple[str, ...], name: str, default: str) -> str:
    """The value the workers are given for `name` (its last `name VALUE`), or `default`."""
    values = [worker_args[i + 1] for i, arg in enumerate(worker_args[:-1]) if arg == name]
    return values[-1] if values else default
