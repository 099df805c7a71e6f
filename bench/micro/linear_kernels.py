"""The model's matmuls on each CPU path: float32 on our panel kernel (the default) and on oneDNN
(the fallback), int8 weights on the panel kernel and on torch's `_weight_int8pack_mm`; the panel
kernel on this CPU's default path and on its other vector paths beside it (AVX2 and AVX-512 where
the CPU has both).

    pdserve bench linear [--model PATH] [--rows 1,16,64,512] [--calls 50] [--step] [--json]

Every distinct weight shape of the model (fused QKV, o_proj, fused gate/up, down, the lm_head),
random values, prepared as the engine prepares them (`core/model/gemm.prepare`).

Default: per row count and shape, the median milliseconds of `--calls` calls after 5 warm-up
calls, all arms on the same input, one after another. Warm repeated calls keep a small weight in
the caches, which favours the smaller shapes.

`--step`: what a decode step's matmuls cost, cold, as the engine runs them: every layer's weights
(as many copies of each shape as the model has layers), each called once in layer order, the arms
alternating for `--calls` rounds after one warm-up round; the median milliseconds of a step and
the weights' bytes per second. `_weight_int8pack_mm` runs at up to 16 rows (it is slow past that).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch

from pdserve.bench.arg_types import positive_int, positive_ints
from pdserve.core.model import gemm
from pdserve.core.model.config import load_model_config
from pdserve.core.model.gemm import (
    PANEL_FORMATS,
    LinearWeight,
    WeightFormat,
    linear,
    prepare,
    weight_bytes,
)
from pdserve.core.model.precision import quantize_int8
from pdserve.core.model.source import resolve_model
from pdserve.kernels import cpu_panel_linear
from pdserve.kernels.cpu_panel_linear import VectorPath

WARMUP = 5
TORCH_INT8_MAX_ROWS = 16
BASELINE = "float32 onednn"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder (default: the prepared SmolLM2-135M)")
    parser.add_argument("--rows", type=positive_ints, default=[1, 16, 64, 512], help="input rows")
    parser.add_argument(
        "--calls", type=positive_int, default=50, help="timed calls per cell (--step: rounds)"
    )
    parser.add_argument(
        "--step", action="store_true", help="a whole step's matmuls, cold, arms alternating"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per row")


def model_shapes(model: str | None) -> list[tuple[int, int]]:
    """(out_features, in_features) of every distinct projection of the model, in layer order."""
    config = load_model_config(resolve_model(model))
    return list(dict.fromkeys([*_layer_shapes(model), (config.vocab_size, config.hidden_size)]))


def _layer_shapes(model: str | None) -> list[tuple[int, int]]:
    config = load_model_config(resolve_model(model))
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    return [
        (qkv, config.hidden_size),
        (config.hidden_size, config.num_heads * config.head_dim),
        (2 * config.intermediate_size, config.hidden_size),
        (config.hidden_size, config.intermediate_size),
    ]


def step_shapes(model: str | None) -> list[tuple[int, int]]:
    """The shapes a decode step multiplies by, in order: each layer's four, then the lm_head."""
    config = load_model_config(resolve_model(model))
    lm_head = (config.vocab_size, config.hidden_size)
    return _layer_shapes(model) * config.num_layers + [lm_head]


@contextmanager
def _panel_path(path: VectorPath | None) -> Iterator[None]:
    saved = cpu_panel_linear.PATH
    cpu_panel_linear.PATH = path
    try:
        yield
    finally:
        cpu_panel_linear.PATH = saved


@dataclass(frozen=True)
class Arm:
    layer: LinearWeight
    path: VectorPath | None = None  # the panel kernel's path (None: this CPU's default)


@contextmanager
def _float32_panels(on: bool) -> Iterator[None]:
    saved = gemm.FLOAT32_PANELS
    gemm.FLOAT32_PANELS = on
    try:
        yield
    finally:
        gemm.FLOAT32_PANELS = saved


def arms(weight: torch.Tensor, rows: int) -> dict[str, Arm]:
    """Every path that runs `weight` at `rows` rows here, by name: the panel kernel on this CPU's
    default path, and on its other vector paths beside it (`float32 panels avx2`, ...)."""
    with _float32_panels(False):
        prepared = {BASELINE: Arm(prepare(weight))}
    for weights, layer in (("float32", prepare(weight)), ("int8", prepare(weight, None, "int8"))):
        if layer.format in PANEL_FORMATS:
            prepared[f"{weights} panels"] = Arm(layer)
            for path in _other_vector_paths():
                prepared[f"{weights} panels {path.name.lower()}"] = Arm(layer, path)
    if rows <= TORCH_INT8_MAX_ROWS:
        quantized, scales = quantize_int8(weight)
        prepared["int8 torch"] = Arm(LinearWeight(quantized, None, scales, WeightFormat.INT8_ROWS))
    return prepared


def median_ms(call: Callable[[], object], calls: int) -> float:
    for _ in range(WARMUP):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run(args: argparse.Namespace) -> int:
    if cpu_panel_linear.kernel() is None:
        print("linear: the panel kernel is not built here (./setup.sh builds it)")
    print(f"torch threads {torch.get_num_threads()}")
    if args.step:
        return _run_steps(args)
    generator = torch.Generator().manual_seed(0)
    print(f"median ms of {args.calls} warm calls")
    for rows in args.rows:
        for out_features, in_features in model_shapes(args.model):
            weight = torch.randn(out_features, in_features, generator=generator) * 0.05
            x = torch.randn(rows, in_features, generator=generator)
            times = {
                name: round(median_ms(partial(_call, x, arm), args.calls), 4)
                for name, arm in arms(weight, rows).items()
            }
            row = {"rows": rows, "out_features": out_features, "in_features": in_features}
            print(json.dumps(row | times) if args.json else _line(row, times))
    return 0


def _run_steps(args: argparse.Namespace) -> int:
    generator = torch.Generator().manual_seed(0)
    shapes = step_shapes(args.model)
    weights = [torch.randn(*shape, generator=generator) * 0.05 for shape in shapes]
    print(f"a step: {len(shapes)} matmuls; median of {args.calls} rounds, arms alternating")
    for rows in args.rows:
        layers: dict[str, list[Arm]] = {}
        for weight in weights:
            for name, arm in arms(weight, rows).items():
                layers.setdefault(name, []).append(arm)
        inputs = {n: torch.randn(rows, n, generator=generator) for _, n in set(shapes)}
        steps = {name: partial(_step, inputs, arm) for name, arm in layers.items()}
        times = _alternating_rounds(steps, args.calls)
        row: dict[str, object] = {"rows": rows}
        for name, seconds in times.items():
            gigabytes = sum(weight_bytes(arm.layer) for arm in layers[name]) / 1e9
            row[name] = {"ms": round(seconds * 1e3, 3), "gb_per_s": round(gigabytes / seconds, 2)}
        print(json.dumps(row) if args.json else _step_line(row))
        del layers, steps
    return 0


def _other_vector_paths() -> list[VectorPath]:
    widest, default = cpu_panel_linear.widest_path_here(), cpu_panel_linear.default_path_here()
    if widest is None:
        return []
    return [p for p in VectorPath if VectorPath.AVX2 <= p <= widest and p != default]


def _call(x: torch.Tensor, arm: Arm) -> None:
    with _panel_path(arm.path):
        linear(x, arm.layer)


def _step(inputs: dict[int, torch.Tensor], arms: list[Arm]) -> None:
    with _panel_path(arms[0].path):
        for arm in arms:
            linear(inputs[arm.layer.features[1]], arm.layer)


def _alternating_rounds(steps: Mapping[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    """The median seconds of each step, one warm-up round first, the arms taking turns."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        step()
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _line(row: dict[str, int], times: dict[str, float]) -> str:
    shape = f"{row['rows']:>4} x {row['in_features']:>5} -> {row['out_features']:>6}"
    base = times[BASELINE]
    cells = [f"{name} {ms:.3f} ms ({base / ms:.2f}x)" for name, ms in times.items()]
    return f"{shape}: " + ", ".join(cells)


def _step_line(row: dict[str, object]) -> str:
    cells = {name: cell for name, cell in row.items() if isinstance(cell, dict)}
    base = cells[BASELINE]["ms"]
    parts = [
        f"{name} {cell['ms']:.2f} ms ({cell['gb_per_s']:.1f} GB/s, {base / cell['ms']:.2f}x)"
        for name, cell in cells.items()
    ]
    return f"{row['rows']:>4} rows: " + ", ".join(parts)
