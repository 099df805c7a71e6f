"""Rotary position embeddings with the scaling types Llama / Qwen2 / Mistral configs use.

Frequencies follow transformers' `ROPE_INIT_FUNCTIONS` so our forward matches HF's. `dynamic`
(NTK) only changes frequencies past the trained context, which pdserve never serves (requests are
capped at `max_position`), so within that range it equals `default`.
"""

from __future__ import annotations

import math

import torch

from pdserve.core.model.config import ModelConfig, RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Per-pair inverse frequencies and the attention scaling factor applied to cos/sin."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3(inv_freq, rope), 1.0
    if rope.rope_type == "yarn":
        return _yarn(inv_freq, rope, head_dim)
    return inv_freq, 1.0


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_context = rope.original_max_position
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(inv_freq: torch.Tensor, rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(rope.original_max_position / (rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta)
        )

    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rope.beta_slow)), head_dim - 1)
    if low == high:
        high += 1  # avoids a division by zero in the ramp below
    ramp = torch.clamp((torch.arange(head_dim // 2).float() - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    interpolated = inv_freq / rope.factor
    blended = interpolated * (1 - extrapolation_weight) + inv_freq * extrapolation_weight
    attention_factor = 0.1 * math.log(rope.factor) + 1.0 if rope.factor > 1 else 1.0
    return blended, attention_factor


class RotaryEmbedding:
    """Precomputed cos/sin for every position the model serves; applied in place of HF's."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        inv_freq, scaling = inverse_frequencies(config.rope, config.head_dim)
        positions = torch.arange(config.max_position, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = (angles.cos() * scaling).to(dtype=dtype, device=device)
        self.sin = (angles.sin() * scaling).to(dtype=dtype, device=device)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for the step's positions, `[tokens, dim]`: looked up once per step
        (`kernels.layer_ops.apply_rotary` rotates with them)."""
        return self.cos[positions], self.sin[positions]
