"""The model's matmuls one at a time: float32 on oneDNN (the default path) against int8 weights on
our CPU kernel (kernels/cpu_panel_linear.py) and on torch's `_weight_int8pack_mm`.

    pdserve bench int8-linear [--model PATH] [--rows 1,16,64,512] [--calls 50] [--json]

Every distinct weight shape of the model (fused QKV, o_proj, fused gate/up, down, the lm_head),
random values, prepared as the engine prepares them (`core/model/gemm.prepare`); per row count and
shape, the median milliseconds of `--calls` calls after 5 warm-up calls, all arms on the same
input, one after another. Warm repeated calls keep a small weight in the caches: an engine step
reads each weight once, cold, so these times favour the smaller shapes; the engine A/B is in
docs/kernels.md. `_weight_int8pack_mm` runs at up to 16 rows (it is slow past that).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from pdserve.bench.arg_types import positive_int, positive_ints
from pdserve.core.model.config import load_model_config
from pdserve.core.model.gemm import LinearWeight, WeightFormat, linear, prepare
from pdserve.core.model.precision import quantize_int8
from pdserve.core.model.source import resolve_model
from pdserve.kernels import cpu_panel_linear

WARMUP = 5
TORCH_INT8_MAX_ROWS = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")
    parser.add_argument("--rows", type=positive_ints, default=[1, 16, 64, 512], help="input rows")
    parser.add_argument("--calls", type=positive_int, default=50, help="timed calls per cell")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")


def model_shapes(model: str | None) -> list[tuple[int, int]]:
    """(out_features, in_features) of every distinct projection of the model, in layer order."""
    config = load_model_config(resolve_model(model))
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    shapes = [
        (qkv, config.hidden_size),
        (config.hidden_size, config.num_heads * config.head_dim),
        (2 * config.intermediate_size, config.hidden_size),
        (config.hidden_size, config.intermediate_size),
        (config.vocab_size, config.hidden_size),
    ]
    return list(dict.fromkeys(shapes))


def median_ms(call: Callable[[], object], calls: int) -> float:
    for _ in range(WARMUP):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def arms(weight: torch.Tensor, rows: int) -> dict[str, LinearWeight]:
    prepared = {"float32 onednn": prepare(weight)}
    int8 = prepare(weight, None, "int8")
    if int8.format is WeightFormat.INT8_PANELS:
        prepared["int8 kernel"] = int8
    if rows <= TORCH_INT8_MAX_ROWS:
        quantized, scales = quantize_int8(weight)
        prepared["int8 torch"] = LinearWeight(quantized, None, scales, WeightFormat.INT8_ROWS)
    return prepared


def run(args: argparse.Namespace) -> int:
    if cpu_panel_linear.kernel() is None:
        print("int8-linear: the int8 kernel is not built here (./setup.sh builds it)")
    generator = torch.Generator().manual_seed(0)
    print(f"torch threads {torch.get_num_threads()}, median ms of {args.calls} warm calls")
    for rows in args.rows:
        for out_features, in_features in model_shapes(args.model):
            weight = torch.randn(out_features, in_features, generator=generator) * 0.05
            x = torch.randn(rows, in_features, generator=generator)
            times = {
                name: round(median_ms(partial(linear, x, layer), args.calls), 4)
                for name, layer in arms(weight, rows).items()
            }
            row = {"rows": rows, "out_features": out_features, "in_features": in_features}
            print(json.dumps(row | times) if args.json else _line(row, times))
    return 0


def _line(row: dict[str, int], times: dict[str, float]) -> str:
    shape = f"{row['rows']:>4} x {row['in_features']:>5} -> {row['out_features']:>6}"
    base = times["float32 onednn"]
    cells = [f"{name} {ms:.3f} ms ({base / ms:.2f}x)" for name, ms in times.items()]
    return f"{shape}: " + ", ".join(cells)
