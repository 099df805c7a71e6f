"""fcfs vs sjf on a step clock: the real Scheduler, no model (one engine step = one time unit).

The model-free twin of `pdserve bench sjf-latency`: the same workload and Poisson arrivals at
`--load` x capacity, where capacity = requests / steps to finish them all when they arrive
together. Each step runs `Scheduler.schedule()` and `record_computed`, and every request that
caught up gets a token, exactly as LLMEngine does; latency is in steps. A step's real cost grows
with its tokens, so this shows the policies' effect on ordering, not on time; sjf-latency measures
time.

    pdserve bench sjf-steps --load 0.8 --rounds 20 --max-num-seqs 4 --sjf-aging-tokens 1
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pdserve.bench.offline.workload import WORKLOAD_DIR, WorkloadRequest, load_workload
from pdserve.bench.sjf.latency import compare_policies
from pdserve.core.config import EngineConfig, SchedulingPolicy
from pdserve.core.request import Request, RequestStatus
from pdserve.core.sampling_params import SamplingParams
from pdserve.core.sched.scheduler import Scheduler


def run_steps(
    config: EngineConfig, requests: list[WorkloadRequest], arrivals: list[float]
) -> list[int]:
    """Each request's finish step - arrival step, in input order."""
    scheduler = Scheduler(config)
    pending = sorted(range(len(requests)), key=lambda index: arrivals[index])
    live: dict[str, Request] = {}
    latency: dict[int, int] = {}
    step = 0
    while len(latency) < len(requests):
        while pending and arrivals[pending[0]] <= step:
            index = pending.pop(0)
            params = SamplingParams(max_tokens=requests[index].max_tokens)
            request = Request(str(index), list(requests[index].prompt), params, index, step)
            live[request.request_id] = request
            scheduler.add(request)
        output = scheduler.schedule()
        for request_id, num_new in output.num_scheduled_tokens.items():
            request = live[request_id]
            scheduler.record_computed(request, num_new)
            if request.num_computed_tokens == request.num_tokens:
                request.output_token_ids.append(0)
                if len(request.output_token_ids) == request.params.max_tokens:
                    scheduler.finish(request, RequestStatus.FINISHED_LENGTH)
                    latency[int(request_id)] = step + 1 - int(arrivals[int(request_id)])
        step += 1
    return [latency[index] for index in range(len(requests))]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", type=Path, default=WORKLOAD_DIR / "mixed.json")
    parser.add_argument("--load", type=float, default=0.8, help="arrival rate / capacity")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=20, help="Poisson schedules per policy")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sjf-aging-tokens", type=int, default=EngineConfig().sjf_aging_tokens)


def run(args: argparse.Namespace) -> int:
    requests = load_workload(args.workload)
    configs = {
        policy.value: EngineConfig(
            max_num_seqs=args.max_num_seqs, policy=policy, sjf_aging_tokens=args.sjf_aging_tokens
        )
        for policy in (SchedulingPolicy.FCFS, SchedulingPolicy.SJF)
    }

    def run(policy: str, arrivals: list[float]) -> list[float]:
        return [float(steps) for steps in run_steps(configs[policy], requests, arrivals)]

    compare_policies(run, len(requests), args, "steps")
    return 0
