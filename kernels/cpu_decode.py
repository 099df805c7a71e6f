"""The CPU's paged decode attention kernel (cpu_decode.cpp): built once by `./setup.sh`, loaded if
built, else decode attention runs in plain torch (torch_decode.py), saying so once.

Why a kernel: `pdserve bench offline --profile` put decode attention at 9-10x its floor (the KV
bytes it must read over the host's copy bandwidth) at 16 and 64 sequences, a quarter to a third
of a decode step, and at 18x at one sequence: the torch path gathers every sequence's keys and
values into padded tensors (a copy of all of them) and runs SDPA per length bucket, about ten
torch calls a layer. The kernel reads K/V where they lie in the blocks, one call a layer for
every sequence, split over pieces of up to 256 positions of each (sequence, KV head) on torch's
own threads (so that one long sequence keeps both threads busy), the pieces' softmaxes merged
after. docs/kernels.md has the A/Bs that decided it.

It is built and loaded as every CPU kernel of ours is (cpu_extensions.py: `./setup.sh` builds it,
`PDSERVE_CPU_KERNELS=off` keeps the torch path).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import ModuleType

import torch

from .cpu_extensions import SWITCH as SWITCH
from .cpu_extensions import CpuExtension

EXTENSION = CpuExtension(
    "pdserve_cpu_decode", Path(__file__).with_name("cpu_decode.cpp"), "decode attention"
)


@cache
def kernel() -> ModuleType | None:
    """The built kernel, or None (torch's path runs): switched off, or never built here."""
    return EXTENSION.load()


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
