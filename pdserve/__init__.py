"""pdserve: a disaggregated LLM inference server (router, prefill tier, decode tier).

`pdserve.LLM` and `pdserve.SamplingParams` are the offline API; `LLM.generate` returns
`RequestOutput`s holding `CompletionOutput`s, as vLLM's does. They are imported on first use so
that light entry points (the gRPC client, the CLI parser) never pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LLM": "pdserve.core.llm",
    "SamplingParams": "pdserve.core.sampling_params",
    "EngineConfig": "pdserve.core.config",
    "RequestOutput": "pdserve.core.outputs",
    "CompletionOutput": "pdserve.core.outputs",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pdserve' has no attribute {name!r}")


__all__ = ["LLM", "CompletionOutput", "EngineConfig", "RequestOutput", "SamplingParams"]
