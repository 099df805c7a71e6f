"""The model facts pdserve needs, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


class UnsupportedModelError(ValueError):
    """The folder holds a model pdserve cannot run (its message names what and why)."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"  # default | linear | dynamic | llama3 | yarn
    factor: float = 1.0
    # llama3 / yarn settings; unused by the other types.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope: RopeConfig
    sliding_window: int | None
    eos_token_ids: tuple[int, ...] = field(default=())


def load_model_config(model_dir: Path) -> ModelConfig:
    path = model_dir / "config.json"
    if not path.exists():
        raise UnsupportedModelError(f"model: no config.json in {model_dir}")
    raw: dict[str, Any] = json.loads(path.read_text())
    architecture = (raw.get("architectures") or ["<none>"])[0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"model: architecture {architecture!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    num_heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    return ModelConfig(
        architecture=architecture,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(raw.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        # Qwen2 has q/k/v biases without saying so in its config.
        attention_bias=bool(raw.get("attention_bias", architecture == "Qwen2ForCausalLM")),
        rope=_rope_config(raw),
        sliding_window=_sliding_window(raw),
        eos_token_ids=_eos_ids(model_dir, raw),
    )


def _rope_config(raw: dict[str, Any]) -> RopeConfig:
    params: dict[str, Any] = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in ("default", "linear", "dynamic", "llama3", "yarn"):
        raise UnsupportedModelError(f"model: rope type {rope_type!r} is not supported")
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(
            params.get("original_max_position_embeddings", raw.get("max_position_embeddings", 0))
        ),
        beta_fast=float(params.get("beta_fast", 32.0)),
        beta_slow=float(params.get("beta_slow", 1.0)),
    )


def _sliding_window(raw: dict[str, Any]) -> int | None:
    """The window every layer attends within, or None for full attention. One window for all
    layers is what the model code does: a config whose layers mix the two is refused."""
    window = raw.get("sliding_window")
    if window is None or raw.get("use_sliding_window") is False:
        return None
    kinds = set(_layer_types(raw))
    if kinds == {"full_attention"}:
        return None
    if kinds != {"sliding_attention"}:
        raise UnsupportedModelError(
            f"model: layers mixing sliding-window and full attention are not supported "
            f"(layer types {sorted(kinds)})"
        )
    return int(window)


def _layer_types(raw: dict[str, Any]) -> list[str]:
    """Each layer's attention as transformers derives it: `layer_types` when the config lists
    them (transformers 5), else Qwen2's rule (layers from `max_window_layers` on slide)."""
    num_layers = int(raw["num_hidden_layers"])
    if raw.get("layer_types"):
        return [str(kind) for kind in raw["layer_types"]]
    first_sliding = int(raw.get("max_window_layers", 0)) if raw.get("use_sliding_window") else 0
    return [
        "sliding_attention" if index >= first_sliding else "full_attention"
        for index in range(num_layers)
    ]


def _eos_ids(model_dir: Path, raw: dict[str, Any]) -> tuple[int, ...]:
    """EOS ids from generation_config.json if present (what `generate` uses), else config."""
    generation = model_dir / "generation_config.json"
    value = raw.get("eos_token_id")
    if generation.exists():
        value = json.loads(generation.read_text()).get("eos_token_id", value)
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)
