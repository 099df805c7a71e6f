"""Ahead-of-time compile of every Triton kernel variant for a CUDA target, without a GPU.

`triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", arch, 32))` runs the
whole pipeline (ttir -> ttgir -> llir -> ptx -> cubin with the ptxas bundled in the wheel) for the
given architecture; no driver is touched. This is what the no-GPU compile test runs:

    .venv/bin/python -m pdserve.kernels.triton_compile 80 90

It must run without TRITON_INTERPRET (the interpreter replaces `triton.jit` functions).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .triton_decode import decode_kernel, group_pad, merge_splits_kernel
from .triton_kv import COPY_CHUNK, copy_blocks_kernel, write_kv_kernel
from .triton_prefill import prefill_kernel, tile_sizes

TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
FLOAT_ARGS = frozenset({"scale_log2e"})


@dataclass(frozen=True)
class KernelVariant:
    """One specialisation of a kernel: pointer element types and constexpr values."""

    label: str
    kernel: Any  # a triton.JITFunction
    pointers: dict[str, str]
    constexprs: dict[str, Any] = field(default_factory=dict)

    def source(self) -> ASTSource:
        signature = {}
        for name in self.kernel.arg_names:
            if name in self.constexprs:
                signature[name] = "constexpr"
            elif name in self.pointers:
                signature[name] = "*" + self.pointers[name]
            else:
                signature[name] = "fp32" if name in FLOAT_ARGS else "i32"
        return ASTSource(self.kernel, signature, constexprs=self.constexprs)


def _attention_pointers(dtype: str, names: list[str]) -> dict[str, str]:
    index_types = {"block_tables_ptr": "i32", "context_lens_ptr": "i32"}
    index_types["query_start_loc_ptr"] = "i32"
    return {name: index_types.get(name, dtype) for name in names}


def variants(head_dim: int = 64, group: int = 3, block_size: int = 16) -> Iterator[KernelVariant]:
    """Every dtype x code path the launchers can produce (head_dim only changes tile shapes)."""
    head_pad = triton.next_power_of_2(head_dim)
    for torch_dtype, dtype in TRITON_TYPES.items():
        fp32 = torch_dtype == torch.float32
        attention = {"GROUP": group, "HEAD_DIM": head_dim, "HEAD_PAD": head_pad}
        attention["BLOCK_SIZE"] = block_size
        names = ["q_ptr", "k_cache_ptr", "v_cache_ptr", "block_tables_ptr", "context_lens_ptr"]
        for single in (True, False):
            part = dtype if single else "fp32"
            pointers = _attention_pointers(dtype, [*names, "out_ptr"])
            pointers.update(part_m_ptr=part, part_l_ptr=part, part_acc_ptr=part)
            constexprs = {**attention, "GROUP_PAD": group_pad(group), "TILE": 64}
            constexprs.update(DOT_FP32=fp32, SINGLE_SPLIT=single)
            label = f"decode {dtype} {'single' if single else 'split'}"
            yield KernelVariant(label, decode_kernel, pointers, constexprs)
        merge = {"out_ptr": dtype, "part_m_ptr": "fp32", "part_l_ptr": "fp32"}
        merge["part_acc_ptr"] = "fp32"
        merge_constexprs = {"HEAD_DIM": head_dim, "HEAD_PAD": head_pad, "SPLITS_PAD": 8}
        yield KernelVariant(f"merge {dtype}", merge_splits_kernel, merge, merge_constexprs)
        block_m, block_n = tile_sizes(torch_dtype, head_dim)
        prefill_pointers = _attention_pointers(dtype, [*names, "query_start_loc_ptr", "out_ptr"])
        prefill_constexprs = {**attention, "BLOCK_M": block_m, "BLOCK_N": block_n}
        prefill_constexprs["DOT_FP32"] = fp32
        yield KernelVariant(
            f"prefill {dtype}", prefill_kernel, prefill_pointers, prefill_constexprs
        )
        kv = {name: dtype for name in ("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr")}
        kv["slot_mapping_ptr"] = "i64"
        kv_constexprs = {"KV_HEADS": group, "HEAD_DIM": head_dim, "HEADS_PAD": 4}
        kv_constexprs["HEAD_PAD"] = head_pad
        yield KernelVariant(f"write_kv {dtype}", write_kv_kernel, kv, kv_constexprs)
        copy = {"src_ptr": dtype, "dst_ptr": dtype, "src_ids_ptr": "i64", "dst_ids_ptr": "i64"}
        yield KernelVariant(f"copy_blocks {dtype}", copy_blocks_kernel, copy, {"CHUNK": COPY_CHUNK})


def compile_all(arch: int) -> list[str]:
    """Compiles every variant for sm_`arch`; returns one line per kernel (raises on failure)."""
    lines = []
    for variant in variants():
        compiled = triton.compile(variant.source(), target=GPUTarget("cuda", arch, 32))
        lines.append(f"sm_{arch} {variant.label}: cubin {len(compiled.asm['cubin'])} bytes")
    return lines


def main(argv: list[str]) -> int:
    for arch in [int(arg) for arg in argv] or [80, 90]:
        for line in compile_all(arch):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
