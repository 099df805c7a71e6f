"""Decode attention: pdserve's CPU kernel and torch path vs the alternatives, and (GPU) Triton's KV
bandwidth.

    .venv/bin/pdserve bench attention [--seqs 16] [--context 500] [--dtype float32]

Default shape is the serving model's (SmolLM2-135M: 9 heads, 3 KV heads, head_dim 64, block 16):
16 sequences with contexts drawn from context +- 10%, blocks scattered over the pool. Prints ms per
call (median and min of --repeats, candidates interleaved round by round) and KV bytes read per
second, side by side:
- cpu kernel (float32 on the CPU, where ./setup.sh built it): pdserve.kernels.cpu_decode, the
  path float32 CPU serving takes;
- torch decode (length buckets + SDPA): pdserve.kernels.torch_decode, the CPU path for bfloat16,
  float16, int8 KV caches and hosts without a compiler (plan and run in one call here; the model
  plans once per step);
- torch decode (matmuls): one padded gather + mask with explicit matmuls + softmax, the
  alternative that SDPA was chosen over;
- reference: one sequence at a time, pdserve.kernels.reference;
- triton decode (CUDA only): pdserve.kernels.triton_decode.decode_attention.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from pdserve.kernels import cpu_decode, torch_attention, torch_decode
from pdserve.kernels.reference import reference_decode
from pdserve.testing.kernel_cases import HeadConfig, PagedAttentionCase, make_paged_case

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
WARMUP = 3


def matmul_decode(case: PagedAttentionCase) -> torch.Tensor:
    """Decode attention with explicit matmuls over one padded gather, kept for comparison."""
    num_seqs, num_heads, head_dim = case.q.shape
    block_size, kv_heads = case.k_cache.shape[1], case.k_cache.shape[2]
    lens = case.context_lens
    num_blocks = -(-int(lens.max()) // block_size)
    table = case.block_tables[:, :num_blocks]
    keys = torch_attention.gather_blocks(case.k_cache, table).transpose(1, 2).float()
    values = torch_attention.gather_blocks(case.v_cache, table).transpose(1, 2).float()
    queries = (case.q.float() * case.scale).view(num_seqs, kv_heads, -1, head_dim)
    scores = torch.matmul(queries, keys.transpose(-1, -2))
    hidden = torch.arange(num_blocks * block_size, device=lens.device)[None, :] >= lens[:, None]
    scores.masked_fill_(hidden[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, -1), values)
    return out.reshape(num_seqs, num_heads, head_dim).to(case.q.dtype)


def time_rounds(
    calls: dict[str, Callable[[], object]], repeats: int, device: torch.device
) -> dict[str, list[float]]:
    """ms per call of each candidate, interleaved round by round so that load from other
    processes on a shared machine falls on all candidates alike."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_index in range(WARMUP + repeats):
        for name, call in calls.items():
            sync()
            start = time.perf_counter()
            call()
            sync()
            if round_index >= WARMUP:
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def build_case(args: argparse.Namespace, device: torch.device) -> PagedAttentionCase:
    gen = torch.Generator().manual_seed(0)
    jitter = max(1, args.context // 10)
    lens = torch.randint(
        args.context - jitter, args.context + jitter + 1, (args.seqs,), generator=gen
    )
    heads = HeadConfig(args.heads, args.kv_heads, args.head_dim, args.block_size)
    return make_paged_case(lens.tolist(), heads, DTYPES[args.dtype]).to(device)


def candidates(case: PagedAttentionCase, device: torch.device) -> dict[str, Callable[[], object]]:
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    calls: dict[str, Callable[[], object]] = {}
    if cpu_decode.usable(case.q.dtype, device, int8_kv=False):
        calls["cpu kernel"] = lambda: cpu_decode.decode_attention(*args, None)
    calls |= {
        "torch decode (length buckets + SDPA)": lambda: torch_decode.decode_attention(*args),
        "torch decode (matmuls)": lambda: matmul_decode(case),
        "reference (per sequence)": lambda: reference_decode(*args),
    }
    if device.type == "cuda":
        from pdserve.kernels import triton_decode

        calls["triton decode"] = lambda: triton_decode.decode_attention(*args)
    return calls


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    case = build_case(args, device)
    kv_bytes = 2 * int(case.context_lens.sum()) * args.kv_heads * args.head_dim
    kv_bytes *= case.k_cache.element_size()
    print(
        f"decode attention: {args.seqs} seqs, contexts {int(case.context_lens.min())}.."
        f"{int(case.context_lens.max())}, heads {args.heads}/{args.kv_heads}, head_dim "
        f"{args.head_dim}, block {args.block_size}, {args.dtype}, {device}, "
        f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}, "
        f"KV read {kv_bytes / 2**20:.1f} MiB/call"
    )
    print(f"{'implementation':32} {'median ms':>10} {'min ms':>10} {'KV GB/s':>10}")
    for name, times in time_rounds(candidates(case, device), args.repeats, device).items():
        median = statistics.median(times)
        gbps = kv_bytes / (median * 1e-3) / 1e9
        print(f"{name:32} {median:10.3f} {min(times):10.3f} {gbps:10.1f}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--context", type=int, default=500, help="mean context length")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device)
