"""The CPU kernels of our own (C++ beside this file): built once by `./setup.sh`, loaded if built.

Each is built with torch's C++ extension tooling (the compiler of this machine; about 25 s each)
into ~/.cache/pdserve/kernels/ (`PDSERVE_KERNEL_DIR` elsewhere: the container image builds them
into its venv, as it has no compiler at run time), keyed by the source, the flags and the torch
version, so a changed source or torch builds anew. At run time a kernel is only imported: no
compiler is needed where a built one is found, and where none is, the caller's torch path runs
(it says so once). `PDSERVE_CPU_KERNELS=off` keeps every torch path (A/B runs, bisecting).

    python -c "from pdserve.kernels.cpu_extensions import main; main()"   # build all (setup.sh)
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

# -ffast-math lets the compiler vectorize sums and the softmax's exp (libmvec): the sums' order
# differs from torch's, as any other kernel's does. -fopenmp: at::parallel_for is an OpenMP loop
# in torch's headers, serial without it. It links libgomp.so.1, the soname torch's own copy has:
# the process's one OpenMP runtime (torch's, loaded first) runs every kernel.
FLAGS = ("-O3", "-ffast-math", "-fopenmp")
CACHE_DIR = Path(
    os.environ.get("PDSERVE_KERNEL_DIR") or Path.home() / ".cache" / "pdserve" / "kernels"
)
SWITCH = "PDSERVE_CPU_KERNELS"


@dataclass(frozen=True)
class CpuExtension:
    name: str  # the Python module's name
    source: Path
    purpose: str  # what runs in torch without it, for the one warning

    def build_dir(self) -> Path:
        key = hashlib.sha256(self.source.read_bytes())
        for header in sorted(self.source.parent.glob("*.h")):  # what the sources include
            key.update(header.read_bytes())
        key.update(" ".join(FLAGS).encode())
        key.update(torch.__version__.encode())
        return CACHE_DIR / f"{self.name}-{key.hexdigest()[:16]}"

    def build(self) -> ModuleType:
        """Compiles the kernel into its build folder (or finds it there) and imports it."""
        from torch.utils.cpp_extension import load

        folder = self.build_dir()
        folder.mkdir(parents=True, exist_ok=True)
        module: ModuleType = load(
            name=self.name,
            sources=[str(self.source)],
            extra_cflags=list(FLAGS),
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
        )
        return module

    def load(self) -> ModuleType | None:
        """The built kernel, or None (the torch path runs): switched off, or never built here."""
        if os.environ.get(SWITCH, "on") == "off":
            log.info("%s=off: %s runs in plain torch", SWITCH, self.purpose)
            return None
        library = self.build_dir() / f"{self.name}.so"
        if not library.is_file():
            log.warning(
                "the CPU kernel %s is not built (./setup.sh builds it): %s runs in plain torch",
                self.name,
                self.purpose,
            )
            return None
        loader = importlib.machinery.ExtensionFileLoader(self.name, str(library))
        spec = importlib.util.spec_from_file_location(self.name, library, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module


def main() -> int:
    from . import cpu_decode, cpu_panel_linear, decode_step, layer_ops

    failed = 0
    extensions = (
        cpu_decode.EXTENSION,
        cpu_panel_linear.EXTENSION,
        layer_ops.EXTENSION,
        decode_step.EXTENSION,
    )
    for extension in extensions:
        try:
            extension.build()
        except Exception as error:
            failed += 1
            print(
                f"{extension.name}: building failed ({error}); {extension.purpose} will run in "
                "plain torch",
                file=sys.stderr,
            )
            continue
        print(f"{extension.name}: built in {extension.build_dir()}")
    return 1 if failed else 0
