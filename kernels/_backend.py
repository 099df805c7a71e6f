"""Which implementation an op runs: the one place that decides.

- CUDA tensors and triton importable: compiled Triton kernels.
- CPU tensors and `TRITON_INTERPRET=1` in the environment when this module was first imported:
  the same Triton kernels under Triton's interpreter (tests only; it is 200-5000x slower).
- Anything else: the torch implementations. A compiled kernel never sees a CPU tensor.
- An int8 KV cache (`--kv-cache-dtype int8`): the torch implementations on every device, since
  the Triton kernels read float caches only (docs/kernels.md, "INT8 KV cache").

`TRITON_INTERPRET` is Triton's own switch (Triton reads it when it is imported), so it is read here
once, at import, rather than taken from pdserve's config: the two must agree, and only the
environment can make them agree before triton is imported.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from typing import Final

import torch

TRITON_INTERPRET: Final[bool] = os.environ.get("TRITON_INTERPRET") == "1"


@cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(device: torch.device, int8_kv: bool = False) -> bool:
    """Whether tensors on `device` go to the Triton kernels (`int8_kv`: the op reads or writes
    an int8 KV cache)."""
    if int8_kv:
        return False
    if device.type == "cuda":
        return triton_available()
    return device.type == "cpu" and TRITON_INTERPRET and triton_available()


def require_triton_device(tensor: torch.Tensor, name: str) -> None:
    """Guards the Triton launchers: a compiled kernel must never get host memory."""
    if not use_triton(tensor.device):
        raise ValueError(
            f"{name}: the Triton kernels need a CUDA tensor (or TRITON_INTERPRET=1 for CPU), "
            f"got one on {tensor.device}"
        )
