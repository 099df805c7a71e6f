"""The host's own limits, measured in the run that is judged by them: memory bandwidth and matmul
peak. Absolute speeds vary 3-5x between hosts of one kind (and a host's bandwidth moves between
runs seconds apart), so a floor is only meaningful beside the times measured with it.

Bandwidth is counted STREAM-style over a large torch copy: bytes read + bytes written, divided by
the time of the copy. Peak is a large square float matmul (torch's own, all its threads): the
most flops/s the step's matmuls could hope for.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

COPY_BYTES = 1 << 30
COPY_REPEATS = 7
PEAK_SIZE = 1024  # 2 GFLOP a matmul: long enough to time, short enough to repeat
PEAK_REPEATS = 5


@dataclass(frozen=True)
class HostBounds:
    copy_bandwidth: float  # bytes/s, read + written
    peak_flops: float  # flops/s of a large matmul in the model's dtype

    def floor_seconds(self, nbytes: int, flops: int) -> float:
        """The least time any implementation needs to move `nbytes` and do `flops`."""
        return max(nbytes / self.copy_bandwidth, flops / self.peak_flops)


def measure_bounds(dtype: torch.dtype = torch.float32) -> HostBounds:
    return HostBounds(measure_copy_bandwidth(), measure_peak_flops(dtype))


def measure_copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> float:
    """Median (read + write) bytes/s of copying one `nbytes` tensor into another."""
    source = torch.ones(nbytes // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    target.copy_(source)  # touch every page first
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(times)


def measure_peak_flops(dtype: torch.dtype, size: int = PEAK_SIZE) -> float:
    """Best flops/s of `size`-cubed matmuls in `dtype` (the best: the peak is what is possible)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm-up: threads, caches, the library's dispatch
    times = []
    for _ in range(PEAK_REPEATS):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times)
