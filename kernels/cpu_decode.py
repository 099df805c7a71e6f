"""The CPU's paged decode attention kernel (cpu_decode.cpp): built once by `./setup.sh`, loaded if
built, else decode attention runs in plain torch (torch_decode.py), saying so once.

Why a kernel: `pdserve bench offline --profile` put decode attention at 9-10x its floor (the KV
bytes it must read over the host's copy bandwidth) at 16 and 64 sequences, a quarter to a third
of a decode step, and at 18x at one sequence: the torch path gathers every sequence's keys and
values into padded tensors (a copy of all of them) and runs SDPA per length bucket, about ten
torch calls a layer. The kernel reads K/V where they lie in the blocks, one call a layer for
every sequence, split over (sequence, KV head) on torch's own threads. docs/kernels.md has the
A/B that decided it.

It is built with torch's C++ extension tooling (the compiler of this machine; about 25 s) into
~/.cache/pdserve/kernels/, keyed by the source, the flags and the torch version, so a changed
source or torch builds anew. At run time it is only imported: no compiler is needed where a built
one is found. `PDSERVE_CPU_KERNELS=off` keeps the torch path (A/B runs, bisecting).

    python -c "from pdserve.kernels.cpu_decode import main; main()"   # build (setup.sh does)
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_decode.cpp")
NAME = "pdserve_cpu_decode"
# -ffast-math lets the compiler vectorize the dot products' sums and the softmax's exp (libmvec):
# the sums' order differs from torch's, as any other kernel's does. -fopenmp: at::parallel_for is
# an OpenMP loop in torch's headers, serial without it. It links libgomp.so.1, the soname torch's
# own copy has: the process's one OpenMP runtime (torch's, loaded first) runs both.
FLAGS = ("-O3", "-ffast-math", "-fopenmp")
CACHE_DIR = Path.home() / ".cache" / "pdserve" / "kernels"
SWITCH = "PDSERVE_CPU_KERNELS"


def build_dir() -> Path:
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(" ".join(FLAGS).encode())
    key.update(torch.__version__.encode())
    return CACHE_DIR / f"{NAME}-{key.hexdigest()[:16]}"


def build() -> ModuleType:
    """Compiles the kernel into its build folder (or finds it there) and imports it."""
    from torch.utils.cpp_extension import load

    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    module: ModuleType = load(
        name=NAME,
        sources=[str(SOURCE)],
        extra_cflags=list(FLAGS),
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
    )
    return module


@cache
def kernel() -> ModuleType | None:
    """The built kernel, or None (torch's path runs): switched off, or never built here."""
    if os.environ.get(SWITCH, "on") == "off":
        log.info("%s=off: decode attention runs in plain torch", SWITCH)
        return None
    library = build_dir() / f"{NAME}.so"
    if not library.is_file():
        log.warning(
            "the CPU decode attention kernel is not built (./setup.sh builds it): "
            "decode attention runs in plain torch"
        )
        return None
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(library))
    spec = importlib.util.spec_from_file_location(NAME, library, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def usable(q_dtype: torch.dtype, device: torch.device, int8_kv: bool) -> bool:
    """Whether a decode step of this kind runs the kernel: float32 on the CPU, float KV cache."""
    return (
        device.type == "cpu" and q_dtype == torch.float32 and not int8_kv and kernel() is not None
    )


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """`[num_seqs, heads, dim]`: each sequence's query over its visible keys (the window's)."""
    module = kernel()
    assert module is not None, "decode_attention called where usable() is False"
    out: torch.Tensor = module.paged_decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, scale, sliding_window or 0
    )
    return out


def main() -> int:
    try:
        build()
    except Exception as error:
        print(
            f"cpu_decode: building the CPU decode attention kernel failed ({error}); "
            "decode attention will run in plain torch",
            file=sys.stderr,
        )
        return 1
    print(f"cpu_decode: built in {build_dir()}")
    return 0
