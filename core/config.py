"""Engine configuration: built once (CLI flags / `PDSERVE_*` env / keyword args) and passed down.

Plain data, no torch: the router and the planner read it (flags, choices) without loading torch;
kv_cache.py and model/precision.py map these names onto torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Model dtypes by torch's names (kv_cache.DTYPES maps each onto its torch.dtype).
MODEL_DTYPES = ("float32", "bfloat16", "float16")
INT8 = "int8"
# "auto": the cache holds the model's dtype; "int8": int8 rows with per-token scales (kv/cache.py).
KV_CACHE_DTYPES = ("auto", INT8)
# Weight-only quantizations (model/precision.py).
QUANTIZATIONS = ("none", INT8)
# Speculative decoding: "off", or how drafts are proposed (core/spec/proposer.py,
# docs/speculative.md).
NGRAM = "ngram"
SPECULATIVE_METHODS = ("off", NGRAM)


class SchedulingPolicy(enum.Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"  # higher `priority` first, then arrival
    SJF = "sjf"  # least remaining work first, aged by arrival (see Scheduler._rank)
    FAIR = "fair"  # the least-served tenant first, by weight (core/sched/fair_share.py)


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    num_kv_blocks: int = 1024
    num_swap_blocks: int = 512
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    policy: SchedulingPolicy = SchedulingPolicy.FCFS
    dtype: str = "float32"
    device: str = "cpu"
    quantization: str = "none"  # or "int8": weight-only, opt-in (core/model/precision.py)
    kv_cache_dtype: str = "auto"  # or "int8": the KV cache's element type (docs/kv_sharing.md)
    enable_prefix_caching: bool = True  # reuse computed full blocks across requests
    sjf_aging_tokens: int = 16  # `sjf`: each later arrival counts as this many more tokens of work
    speculative: str = "off"  # or "ngram": draft from the request's own context, verify in one step
    num_speculative_tokens: int = 4  # most drafted tokens verified per request and step
    # KV offload below the pool (core/kv/offload.py, docs/kv_offload.md): evicted prefix blocks
    # kept in host memory, then on disk (a folder of this worker's own); 0 / "": that tier off.
    kv_offload_host_gb: float = 0.0
    kv_offload_disk_path: str = ""
    kv_offload_disk_gb: float = 0.0

    @property
    def speculates(self) -> bool:
        return self.speculative != "off"

    @property
    def kv_dtype(self) -> str:
        """The KV layout's dtype: the model's, unless the cache is int8."""
        return self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype

    def __post_init__(self) -> None:
        positive = ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens")
        for name in (*positive, "sjf_aging_tokens", "num_speculative_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                f"enable_prefix_caching: must be a bool, got {self.enable_prefix_caching!r}"
            )
        if self.num_swap_blocks < 0:
            raise ValueError(f"num_swap_blocks: must be >= 0, got {self.num_swap_blocks}")
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"dtype: must be one of {sorted(MODEL_DTYPES)}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization: must be one of {', '.join(QUANTIZATIONS)}, "
                f"got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype: must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative: must be one of {', '.join(SPECULATIVE_METHODS)}, "
                f"got {self.speculative!r}"
            )
        self._check_offload()
        if not isinstance(self.policy, SchedulingPolicy):
            object.__setattr__(self, "policy", SchedulingPolicy(self.policy))

    def _check_offload(self) -> None:
        for name in ("kv_offload_host_gb", "kv_offload_disk_gb"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0 (GB), got {getattr(self, name)}")
        if bool(self.kv_offload_disk_path) != bool(self.kv_offload_disk_gb):
            raise ValueError(
                "kv_offload_disk_gb: a disk tier needs both kv_offload_disk_path and "
                f"kv_offload_disk_gb > 0, got {self.kv_offload_disk_path!r} and "
                f"{self.kv_offload_disk_gb}"
            )
        if self.kv_offload_enabled and not self.enable_prefix_caching:
            raise ValueError(
                "kv_offload_host_gb: KV offload keeps prefix blocks: it needs the "
                "prefix cache (drop --no-prefix-cache)"
            )

    @property
    def kv_offload_enabled(self) -> bool:
        return self.kv_offload_host_gb > 0 or self.kv_offload_disk_gb > 0
