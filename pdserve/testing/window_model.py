"""Small sliding-window models with fixed-seed weights, built offline with transformers.

No sliding-window model small enough for a test ships on PyPI, so the tests (and `pdserve bench
sliding-window`) build one: a Mistral, or a Qwen2 with `use_sliding_window` (every layer sliding:
`max_window_layers` 0), from a config with a small window and random weights drawn under a fixed
seed, saved as a plain Hugging Face folder with the embedded model's tokenizer. The same seed and
shape with `window=None` gives the full-attention twin: the same weights, attending to everything.

Random weights at transformers' default scale make a model whose next token barely depends on
context, so the window would change little; `init_std` is set higher, so that attention (and
hence the window) decides the greedy tokens.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig

MISTRAL = "mistral"
QWEN2 = "qwen2"


@dataclass(frozen=True)
class WindowModelShape:
    """The model's dimensions; the defaults are tiny (a few million weights, most of them the
    embedding the tokenizer's vocabulary needs)."""

    num_layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    max_position: int = 8192
    init_std: float = 0.25


def build_window_model(
    target: Path,
    tokenizer_dir: Path,
    window: int | None,
    architecture: str = MISTRAL,
    shape: WindowModelShape = WindowModelShape(),
    seed: int = 0,
) -> Path:
    """Writes the model folder at `target` (once: an existing folder is kept) and returns it.
    `tokenizer_dir`: a model folder whose tokenizer (and vocabulary size) the model takes."""
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # a bench prints its table only

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = _config(architecture, window, shape, len(tokenizer))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)  # whole or absent
    except OSError:
        if not (target / "config.json").exists():  # else a concurrent builder's folder won
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _config(
    architecture: str, window: int | None, shape: WindowModelShape, vocab: int
) -> PretrainedConfig:
    from transformers import MistralConfig, Qwen2Config

    common: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_position,
        "initializer_range": shape.init_std,
        "tie_word_embeddings": True,
        "eos_token_id": None,  # no early stop: every output runs to max_tokens, well past W
        "bos_token_id": None,
        "pad_token_id": None,
    }
    if architecture == MISTRAL:
        return MistralConfig(sliding_window=window, **common)
    if architecture == QWEN2:
        return Qwen2Config(
            use_sliding_window=window is not None,
            sliding_window=window,
            max_window_layers=0,
            **common,
        )
    raise ValueError(f"architecture: {MISTRAL} or {QWEN2}, got {architecture!r}")
